"""``backend.ai run``: Backend.AI's execute websocket, bridged to the session's Jupyter kernel.

``GET /stream/session/{id}/execute`` (a websocket, signed like any request). The client
sends one JSON run request ``{"code", "mode", "options"}`` and reads JSON records
``{"status", "console", "exitCode", "options", "files"}``: ``continued`` with
``console`` records (``["stdout", text]``, ``["stderr", text]``) as output arrives,
``waiting-input`` when the code asks for input (the client answers with the bare
text), and ``finished`` with ``exitCode`` 0 at the end.

The session is an interactive session of the caller: a JupyterHub named server, whose
Jupyter server runs in the session's container. The hub talks to that server the way
JupyterHub's proxy would (its address and ``base_url``), with a short-lived API token
of the owner scoped to that one server: it keeps one Jupyter kernel per session (so
state persists between ``run`` calls that reuse the session, like Backend.AI's REPL),
sends ``execute_request`` on the kernel's websocket, and turns the kernel's ``stream``,
``execute_result``/``display_data`` (``text/plain``), ``error`` and ``input_request``
messages into console records.

**Batch mode** (``run IMAGE FILE... [--build CMD] [--exec CMD] [--clean CMD]``): the
client first uploads the files (``POST /session/{id}/upload``, multipart field ``src``,
each named by its path relative to ``--basedir``), which land in the session's Jupyter
server's root directory (``/home/work``) through Jupyter's contents API; then it sends
``{"mode": "batch", "options": {"clean", "build", "exec"}}``. Each command runs as a
shell command (``/bin/sh -c``) from that directory, in a subprocess of the session's
Jupyter kernel, its stdout and stderr streamed as console records; ``clean-finished``
and ``build-finished`` report their exit codes, and ``finished`` (exit code 0) ends the
run. ``*`` is the default: no clean, no build, and ``python main.py`` as the exec command
(exit code 127 when there is no ``main.py``); an empty command is skipped. A step that
fails ends the run there, as a failed run (below).

**Exit code.** The official CLIs (23.09 and 26.09) exit 0 after any ``finished``
record, whatever its ``exitCode``; they exit 1 only when reading the stream raises.
So a run that fails (an exception, ``sys.exit(n)`` with n != 0) ends with a record that
carries ``exitCode`` and a ``console`` line saying so, but no ``status``: the CLI prints
the line, then stops with "Execution failed!" and exit code 1.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import re
import urllib.parse
import uuid

import aiohttp
from tornado import httputil, web, websocket

from ...common.errors import BackendAIError, InvalidRequest, NotFound
from ...common.types import SessionStatus, UserStatus
from ...manager import vfolders
from ..keypair_auth import keypair_auth
from .base import CompatBase

log = logging.getLogger(__name__)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# session id -> the Jupyter kernel id kept for it (checked before each use).
_KERNELS: dict[str, str] = {}
# At most this many execute streams of one user open at once in this hub process (each
# holds a websocket to a Jupyter kernel and a token): past it, 429.
MAX_STREAMS_PER_USER = 8
# Seconds between the checks that the access an open stream was granted still holds.
ACCESS_CHECK = 2.0
# Checks in a row that could not be made (they raised) after which the stream ends.
ACCESS_UNCONFIRMED = 3
# user id -> their execute streams open now (in this process).
_STREAMS: dict[str, int] = {}



# -- the session's Jupyter server, as a client of it (aiohttp: the hub's one client stack
# of ours, as for agents and storage proxies, common/httpbase.py) --------------------------


class _ServerError(Exception):
    """The session's Jupyter server answered with an error status."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"HTTP {code}{': ' + reason if reason else ''}")
        self.code = code


_HTTP: aiohttp.ClientSession | None = None


def _http() -> aiohttp.ClientSession:
    """One connection pool for every call to sessions' Jupyter servers."""
    global _HTTP
    if _HTTP is None or _HTTP.closed:
        _HTTP = aiohttp.ClientSession()
    return _HTTP


async def _fetch(url: str, *, method: str = "GET", headers: dict | None = None,
                 body: str | None = None, timeout: float = 30) -> bytes:
    """One request; the body, or :class:`_ServerError` for a status of 400 or more."""
    async with _http().request(method, url, headers=headers, data=body,
                               timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        data = await r.read()
        if r.status >= 400:
            raise _ServerError(r.status, r.reason or "")
        return data


class _KernelSocket:
    """A kernel's channels websocket: messages out and in, None once it is closed."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws

    @classmethod
    async def connect(cls, url: str, headers: dict) -> _KernelSocket:
        return cls(await _http().ws_connect(url, headers=headers, heartbeat=20,
                                            timeout=aiohttp.ClientWSTimeout(ws_close=10),
                                            max_msg_size=0))

    async def write_message(self, text: str) -> None:
        if self._ws.closed:
            raise _KernelGone()
        await self._ws.send_str(text)

    async def read_message(self) -> str | None:
        msg = await self._ws.receive()
        if msg.type == aiohttp.WSMsgType.TEXT:
            return msg.data
        if msg.type == aiohttp.WSMsgType.BINARY:
            return msg.data.decode(errors="replace")
        return None  # closed, closing or an error

    def close(self) -> None:
        asyncio.ensure_future(self._ws.close())


class _KernelGone(Exception):
    """The kernel's websocket closed."""

class ServerUnavailable(BackendAIError):
    status_code = 502
    title = "Bad gateway"


class TooManyStreams(BackendAIError):
    status_code = 429
    title = "Too many requests"


def _record(status: str | None, console=(), exit_code=None, options=None) -> str:
    rec = {"console": [list(c) for c in console], "exitCode": exit_code,
           "options": options, "files": []}
    if status is not None:
        rec["status"] = status
    return json.dumps(rec)


def _exit_code(reply: dict, error: dict | None) -> int:
    if reply.get("status") == "ok":
        return 0
    err = error or reply
    if err.get("ename") == "SystemExit":
        value = str(err.get("evalue") or "").strip()
        if value in ("", "None", "0"):
            return 0
        return int(value) if re.fullmatch(r"-?\d+", value) else 1
    return 1



async def access_ended(manager, p, sid: str) -> str:
    """Returns (why) once the access a stream into session ``sid`` was opened with ends:
    every ``ACCESS_CHECK`` seconds the session must still run, and the keypair that signed
    the request (or the user, for a JupyterHub token) must still be active. Both reads are
    shared: the session's state by every poll (manager/reflector.py), the keypair's by
    every signed request (its lookup cache, emptied by this hub's changes)."""
    auth = keypair_auth(manager)
    unconfirmed = 0
    while True:
        await asyncio.sleep(ACCESS_CHECK)
        try:
            why = await _access_refusal(manager, auth, p, sid)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # Fail closed: a stream whose access cannot be confirmed for a while ends
            # (a check that raised must not leave it open for good).
            unconfirmed += 1
            log.warning("could not confirm the access of %s's stream into session %s",
                        p.username, sid, exc_info=True)
            if unconfirmed >= ACCESS_UNCONFIRMED:
                return f"the hub could not confirm it ({type(e).__name__})"
            continue
        unconfirmed = 0
        if why is not None:
            return why


async def _access_refusal(manager, auth, p, sid: str) -> str | None:
    """Why the access of principal ``p`` to session ``sid`` has ended; None: it holds."""
    state = await manager.reflector.state(sid)
    if state is None or state.dead:
        return "the session ended"
    rec = (await auth.lookup(p.access_key) if p.access_key
           else await auth.hub_user_record(p.username))
    if rec is None or (p.access_key and not rec.keypair_active):
        return "the keypair was deactivated or deleted"
    if rec.user_status != UserStatus.ACTIVE or (p.access_key and not rec.domain_active):
        return f"user {p.username!r} is no longer active"
    return None


class _JupyterServer:
    """The caller's own running interactive session, reached as its Jupyter server: its
    URL (``_base``) and a short-lived API token of the owner for that one server."""

    _token: str | None = None

    #: What needs the session (the refusals' words).
    _needs = ("code runs", "its Jupyter kernel; run without --type batch")

    async def _check_session(self, ref: str) -> str:
        """The id of ``ref``, the caller's own RUNNING interactive session; else refused."""
        sid = await self.manager.ops.resolve_session(self.principal, ref)
        sess = await self.manager.ops.get_session(self.principal, sid)
        what, why = self._needs
        if sess["user_id"] != self.principal.user_id:
            raise NotFound(f"no session {ref!r} of yours ({what} only in your own sessions)")
        if sess["type"] != "interactive":
            raise InvalidRequest(
                f"session {sess['name']!r} is a {sess['type']} session: {what} in an "
                f"interactive session ({why})")
        if sess["status"] != SessionStatus.RUNNING:
            raise InvalidRequest(f"session {sess['name']!r} is {sess['status']}, not RUNNING")
        return sid

    async def _open_server(self, ref: str) -> None:
        self._sid = await self._check_session(ref)
        await self._find_server()
        self._mint_token()

    async def _find_server(self) -> None:
        """The JupyterHub server of session ``_sid`` (waiting while JupyterHub has not
        yet seen it answer); nothing is made for the caller yet."""
        username = await self.manager.ops.username_of(self.principal.user_id)
        user = self.find_user(username)
        for name, spawner in list((user.spawners if user else {}).items()):
            if getattr(spawner, "session_id", None) != self._sid:
                continue
            # The session runs before JupyterHub has seen its server answer: wait for that.
            deadline = asyncio.get_running_loop().time() + 120
            while spawner.pending == "spawn" and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
            if spawner.ready:
                self._user, self._server_name, self._server = user, name, spawner
                self._base = spawner.server.url.rstrip("/") + "/"
                return
        raise InvalidRequest("this interactive session is not a running JupyterHub server "
                             "of yours, so it has no Jupyter kernel to run code in")

    def _mint_token(self, what: str = "run") -> None:
        """A short-lived token of the owner for that one server (dropped by
        ``_drop_token``)."""
        self._token = self._user.new_api_token(
            scopes=[f"access:servers!server={self._user.name}/{self._server_name}"],
            expires_in=3600, note=f"backend.ai {what} in {self._server_name}")

    def _auth(self) -> dict:
        return {"Authorization": f"token {self._token}"}

    def _drop_token(self) -> None:
        if self._token:
            from jupyterhub import orm

            tok = orm.APIToken.find(self.db, self._token)
            if tok is not None:
                self.db.delete(tok)
                self.db.commit()
            self._token = None


class ExecuteHandler(websocket.WebSocketHandler, CompatBase, _JupyterServer):
    """The execute websocket of one session (see the module's doc). It runs code: a
    JupyterHub token needs the write scope here, though the handshake is a GET."""

    grants_shell = True

    _task: asyncio.Task | None = None
    _input: asyncio.Future | None = None
    _kernel_ws = None
    _watch: asyncio.Task | None = None

    def check_xsrf_cookie(self):
        return None

    _counted: str | None = None

    async def get(self, ref):
        # Whatever can refuse the request is decided before anything is made for it:
        # the caller (prepare), their number of open streams, the session and its server
        # here; the handshake and its origin in tornado's get. The token and the kernel's
        # websocket are made in open(), once the handshake is accepted.
        uid = self.principal.user_id
        if _STREAMS.get(uid, 0) >= MAX_STREAMS_PER_USER:
            raise TooManyStreams(
                f"you have {MAX_STREAMS_PER_USER} execute streams open (the most at once): "
                "close one first")
        self._sid = await self._check_session(ref)
        await self._find_server()
        _STREAMS[uid] = _STREAMS.get(uid, 0) + 1
        self._counted = uid
        try:
            await super().get(ref)
        finally:
            if self.ws_connection is None:  # refused (upgrade, origin): release the place
                self._cleanup()

    async def open(self, ref):
        try:
            self._mint_token()
            self._kernel = await self._ensure_kernel()
            self._kernel_ws = await _KernelSocket.connect(
                f"ws{self._base[4:]}api/kernels/{self._kernel}/channels"
                f"?session_id={uuid.uuid4().hex}", self._auth())
        except (_ServerError, aiohttp.ClientError, OSError, TimeoutError) as e:
            self._finish_failed(f"the session's Jupyter server did not answer: {e}")
            self._cleanup()
            return
        self._watch = asyncio.ensure_future(self._watch_access())

    async def _watch_access(self) -> None:
        why = await access_ended(self.manager, self.principal, self._sid)
        self._finish_failed(f"access ended: {why}")
        self._cleanup()

    async def _ensure_kernel(self) -> str:
        kid = _KERNELS.get(self._sid)
        if kid:
            try:
                await _fetch(f"{self._base}api/kernels/{kid}", headers=self._auth())
                return kid
            except _ServerError as e:
                if e.code != 404:
                    raise
        body = await _fetch(f"{self._base}api/kernels", method="POST", body="{}",
                            headers={**self._auth(), "Content-Type": "application/json"},
                            timeout=60)
        kid = _KERNELS[self._sid] = json.loads(body)["id"]
        return kid

    # -- the client's side ------------------------------------------------------

    def on_message(self, message):
        if self._task is None:
            try:
                req = json.loads(message)
                if not isinstance(req, dict):
                    raise ValueError
            except ValueError:
                self._finish_failed("the first message must be a JSON run request "
                                    '{"code", "mode", "options"}', 2)
                return
            self._task = asyncio.ensure_future(self._run(req))
        elif self._input is not None and not self._input.done():
            self._input.set_result(message if isinstance(message, str) else message.decode())

    def on_close(self):
        if self._task is not None and not self._task.done():
            self._task.cancel()
            asyncio.ensure_future(self._interrupt())
        self._cleanup()

    async def _interrupt(self):
        try:
            await _fetch(f"{self._base}api/kernels/{self._kernel}/interrupt", method="POST",
                         body="", headers=self._auth(), timeout=10)
        except Exception:
            self.log.debug("interrupting kernel %s failed", self._kernel, exc_info=True)

    def _cleanup(self):
        watch, self._watch = self._watch, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
        if self._kernel_ws is not None:
            self._kernel_ws.close()
            self._kernel_ws = None
        self._drop_token()
        if self._counted is not None:
            left = _STREAMS.get(self._counted, 1) - 1
            if left > 0:
                _STREAMS[self._counted] = left
            else:
                _STREAMS.pop(self._counted, None)
            self._counted = None

    def _send(self, text: str) -> None:
        try:
            self.write_message(text)
        except websocket.WebSocketClosedError:
            pass

    def _finish_failed(self, why: str, code: int = 1) -> None:
        self._send(_record(None, [("stderr", f"Execution failed: {why} (exit code = {code})\n")],
                           exit_code=code))
        self.close()

    # -- the kernel's side ------------------------------------------------------

    def _kernel_msg(self, channel: str, msg_type: str, content: dict, parent: dict | None = None):
        return json.dumps({
            "header": {"msg_id": uuid.uuid4().hex, "username": self.principal.username,
                       "session": self._session, "msg_type": msg_type, "version": "5.3",
                       "date": dt.datetime.now(dt.UTC).isoformat()},
            "parent_header": parent or {}, "metadata": {}, "content": content,
            "channel": channel, "buffers": []})

    async def _run(self, req: dict) -> None:
        mode, code = req.get("mode", "query"), req.get("code")
        self._session = uuid.uuid4().hex
        if mode == "batch":
            await self._run_batch(req.get("options"))
            return
        if mode != "query" or not isinstance(code, str):
            self._finish_failed(f"mode {mode!r} is not supported by this server (query: "
                                "run -c CODE; batch: run IMAGE FILE...)", 2)
            return
        done = await self._run_code(code)
        if done is None:
            return
        reply, error = done
        code = _exit_code(reply, error)
        if code == 0:
            self._send(_record("finished", exit_code=0))
            self.close()
        else:
            why = (f"SystemExit({code})" if (error or {}).get("ename") == "SystemExit"
                   else f"{(error or reply).get('ename', 'error')}")
            self._finish_failed(why, code)

    async def _run_batch(self, opts) -> None:
        """clean, build, exec: shell commands, one after the other (see the module's doc)."""
        if not isinstance(opts, dict) or any(
                not isinstance(opts.get(k), (str, type(None))) for k in _STEPS):
            self._finish_failed("batch mode needs options {clean, build, exec}: strings", 2)
            return
        for key, status in _STEPS.items():
            cmd = opts.get(key)
            if cmd == "*":
                cmd = _DEFAULT_STEP[key]
            if cmd:
                done = await self._run_code(_SHELL + f"_bai_rc = _bai_shell({cmd!r})\n",
                                           {"rc": "_bai_rc"}, history=False)
                if done is None:
                    return
                rc = _shell_rc(*done)
                if rc != 0:
                    self._finish_failed(f"the {key} command exited with {rc}", rc)
                    return
            if key == "exec":
                self._send(_record("finished", exit_code=0))
                self.close()
            elif cmd:
                self._send(_record(status, exit_code=0))

    async def _run_code(self, code: str, expressions: dict | None = None,
                       history: bool = True) -> tuple[dict, dict | None] | None:
        """Run ``code`` in the kernel, its output sent as console records as it comes:
        (execute_reply, the error message if any); None when the run ended here (the
        kernel went away, the client closed)."""
        msg = self._kernel_msg("shell", "execute_request", {
            "code": code, "silent": False, "store_history": history,
            "user_expressions": expressions or {}, "allow_stdin": True,
            "stop_on_error": True})
        msg_id = json.loads(msg)["header"]["msg_id"]
        await self._kernel_ws.write_message(msg)
        reply, idle, error = None, False, None
        try:
            while reply is None or not idle:
                raw = await self._kernel_ws.read_message()
                if raw is None:
                    self._finish_failed("the session's Jupyter kernel went away")
                    return None
                m = json.loads(raw)
                if m.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = m["header"]["msg_type"], m.get("content", {})
                if kind == "stream":
                    self._send(_record("continued", [(content.get("name", "stdout"),
                                                      content.get("text", ""))]))
                elif kind in ("execute_result", "display_data"):
                    text = (content.get("data") or {}).get("text/plain")
                    if text is not None:
                        self._send(_record("continued", [("stdout", text + "\n")]))
                elif kind == "error":
                    error = content
                    if content.get("ename") == "SystemExit":
                        continue
                    tb = _ANSI.sub("", "\n".join(content.get("traceback") or []))
                    self._send(_record("continued", [("stderr", tb + "\n")]))
                elif kind == "input_request":
                    self._input = asyncio.get_running_loop().create_future()
                    self._send(_record("waiting-input", [("stdout", content.get("prompt", ""))],
                                       options={"is_password": bool(content.get("password"))}))
                    value = await self._input
                    await self._kernel_ws.write_message(self._kernel_msg(
                        "stdin", "input_reply", {"value": value}, parent=m["header"]))
                elif kind == "execute_reply":
                    reply = content
                elif kind == "status" and content.get("execution_state") == "idle":
                    idle = True
        except (_KernelGone, aiohttp.ClientError, ConnectionError):
            return None
        return reply, error


# Batch mode's steps and the records that end them; "*": the default command.
_STEPS = {"clean": "clean-finished", "build": "build-finished", "exec": "finished"}
_DEFAULT_STEP = {
    "clean": None, "build": None,
    "exec": "if [ -f main.py ]; then exec python main.py; else echo 'no main.py to run: "
            "give --exec CMD' >&2; exit 127; fi",
}
# Runs in the session's kernel: one shell command, its stdout and stderr streamed as
# they come (one thread: ipykernel routes a thread's output by its own rules).
_SHELL = """\
def _bai_shell(cmd):
    import codecs, os, selectors, subprocess, sys
    p = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sel = selectors.DefaultSelector()
    for src, dst in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
        sel.register(src, selectors.EVENT_READ,
                     (dst, codecs.getincrementaldecoder("utf-8")("replace")))
    try:
        while sel.get_map():
            for key, _ in sel.select():
                data = os.read(key.fd, 65536)
                dst, dec = key.data
                if not data:
                    sel.unregister(key.fileobj)
                text = dec.decode(data, final=not data)
                if text:
                    dst.write(text)
                    dst.flush()
        return p.wait()
    except BaseException:
        p.kill()
        raise
"""


def _shell_rc(reply: dict, error: dict | None) -> int:
    if reply.get("status") != "ok":
        return _exit_code(reply, error) or 1
    value = (((reply.get("user_expressions") or {}).get("rc") or {}).get("data") or {}).get(
        "text/plain", "")
    return int(value) if re.fullmatch(r"-?\d+", value or "") else 1


# At most this much per upload request (files for a batch run; data goes through folders).
MAX_UPLOAD_FILES = 1000
MAX_UPLOAD_BYTES = 64 * 2**20


# Multipart framing on top of the files' bytes that a body may carry.
_MULTIPART_SLACK = 1 << 20
_DRAIN = 256 * 2**20


@web.stream_request_body
class SessionUploadHandler(CompatBase, _JupyterServer):
    """``POST /session/{id}/upload``: the files of ``run IMAGE FILE...`` (multipart field
    ``src``, each named by its relative path) into the session's Jupyter server's root
    directory (``/home/work``), through its contents API, existing files replaced. Bad
    names and sizes are refused before anything is written; if the server refuses a
    file, the files this request created are removed again.

    The body is streamed: the caller is authenticated before any of it is kept (the
    hub holds no more than :mod:`...bodylimit` allows for anyone unknown), then at most
    :data:`MAX_UPLOAD_BYTES` (and the multipart framing) is gathered."""

    _refused: Exception | None = None
    _chunks: list[bytes] | None = None
    _size = 0

    async def prepare(self):
        # A refusal is answered after the body is read and dropped: answering first would
        # make the client see a reset connection instead of the reason.
        try:
            await super().prepare()
        except (BackendAIError, web.HTTPError) as e:
            self._refused = e
            return
        self._chunks = []
        # Up to _DRAIN is read (what is over the bound, dropped) so that the refusal
        # reaches the client; a larger body is cut by tornado.
        self.request.connection.set_max_body_size(_DRAIN)
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_UPLOAD_BYTES + _MULTIPART_SLACK:
            self._too_large()

    def _too_large(self) -> None:
        self._chunks = None
        self._refused = InvalidRequest(
            f"at most {MAX_UPLOAD_BYTES >> 20} MiB per upload (larger data: a folder, "
            "vfolder upload, mounted with -m)")

    def data_received(self, chunk: bytes):
        if self._chunks is None:
            return
        self._size += len(chunk)
        if self._size > MAX_UPLOAD_BYTES + _MULTIPART_SLACK:
            self._too_large()
            return
        self._chunks.append(chunk)

    async def post(self, ref):
        if self._refused is not None:
            raise self._refused
        body, self._chunks = b"".join(self._chunks or ()), None
        args: dict = {}
        found: dict = {}
        try:
            httputil.parse_body_arguments(self.request.headers.get("Content-Type", ""), body,
                                          args, found, self.request.headers)
        except httputil.HTTPInputError as e:
            raise InvalidRequest(f"the body is not valid multipart/form-data: {e}") from None
        del body
        files = found.get("src") or []
        if not files or set(found) != {"src"}:
            raise InvalidRequest("send the files as multipart/form-data, field 'src'")
        if len(files) > MAX_UPLOAD_FILES:
            raise InvalidRequest(f"at most {MAX_UPLOAD_FILES} files per upload")
        if sum(len(f.body) for f in files) > MAX_UPLOAD_BYTES:
            raise InvalidRequest(f"at most {MAX_UPLOAD_BYTES >> 20} MiB per upload (larger "
                                 "data: a folder, vfolder upload, mounted with -m)")
        # (Backend.AI's clients send the names percent-encoded, as aiohttp does)
        paths = [vfolders.check_path(urllib.parse.unquote(f.filename or ""), "file name",
                                     allow_root=False) for f in files]
        for path in paths:
            if any(part.startswith(".") for part in path.split("/")):
                raise InvalidRequest(f"{path!r}: hidden files and directories are not "
                                     "uploaded (the session's Jupyter server refuses them)")
        if len(set(paths)) != len(paths):
            raise InvalidRequest("two files have the same name")
        await self._open_server(ref)
        created: list[str] = []
        dirs: set[str] = set()
        try:
            for f, path in zip(files, paths, strict=True):
                parts = path.split("/")
                for i in range(1, len(parts)):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        await self._contents("PUT", d, {"type": "directory"})
                        dirs.add(d)
                new = await self._contents("GET", path) is None
                await self._contents("PUT", path, {
                    "type": "file", "format": "base64",
                    "content": base64.b64encode(f.body).decode()})
                if new:
                    created.append(path)
        except (_ServerError, aiohttp.ClientError, OSError, TimeoutError) as e:
            for path in created:
                try:
                    await self._contents("DELETE", path)
                except (_ServerError, aiohttp.ClientError, OSError, TimeoutError):
                    self.log.warning("could not remove %s after a failed upload", path)
            if isinstance(e, _ServerError) and e.code in (400, 403, 409, 413):
                raise InvalidRequest(f"{path!r}: the session's Jupyter server refused it "
                                     f"({e.code}); nothing uploaded") from None
            raise ServerUnavailable(f"the session's Jupyter server did not answer: {e}; "
                                    "nothing uploaded") from None
        finally:
            self._drop_token()
        self.reply(None, 204)

    async def _contents(self, method: str, path: str, model: dict | None = None):
        """Jupyter's contents API on ``path``; GET answers None for a missing path."""
        url = f"{self._base}api/contents/{urllib.parse.quote(path)}"
        if method == "GET":
            url += "?content=0"
        try:
            return await _fetch(
                url, method=method, headers={**self._auth(), "Content-Type": "application/json"},
                body=None if model is None else json.dumps(model), timeout=120)
        except _ServerError as e:
            if method == "GET" and e.code == 404:
                return None
            raise
