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

**Exit code.** The official CLIs (23.09 and 26.09) exit 0 after any ``finished``
record, whatever its ``exitCode``; they exit 1 only when reading the stream raises.
So a run that fails (an exception, ``sys.exit(n)`` with n != 0) ends with a record that
carries ``exitCode`` and a ``console`` line saying so, but no ``status``: the CLI prints
the line, then stops with "Execution failed!" and exit code 1.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import uuid

from tornado import websocket
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ...common.errors import BackendAIError, InvalidRequest, NotFound
from ...common.types import SessionStatus
from ...manager import admin
from ...models import User
from .handlers import CompatBase, resolve_session

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# session id -> the Jupyter kernel id kept for it (checked before each use).
_KERNELS: dict[str, str] = {}


class ServerUnavailable(BackendAIError):
    status_code = 502
    title = "Bad gateway"


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


class ExecuteHandler(websocket.WebSocketHandler, CompatBase):
    """The execute websocket of one session (see the module's doc). It runs code: a
    JupyterHub token needs the write scope here, though the handshake is a GET."""

    grants_shell = True

    _task: asyncio.Task | None = None
    _input: asyncio.Future | None = None
    _kernel_ws = None
    _token: str | None = None

    def check_xsrf_cookie(self):
        return None

    async def get(self, ref):
        sid = await self.manager.db_read(resolve_session, self.principal, ref)
        sess = await self.manager.db_read(admin.get_session, self.principal, sid)
        if sess["user_id"] != self.principal.user_id:
            raise NotFound(f"no session {ref!r} of yours (code runs only in your own sessions)")
        if sess["type"] != "interactive":
            raise InvalidRequest(
                f"session {sess['name']!r} is a {sess['type']} session: code runs in an "
                "interactive session (its Jupyter kernel); run without --type batch")
        if sess["status"] != SessionStatus.RUNNING:
            raise InvalidRequest(f"session {sess['name']!r} is {sess['status']}, not RUNNING")
        self._sid = sid
        self._base, self._server = await self._server_of(sid)
        try:
            self._kernel = await self._ensure_kernel()
            self._kernel_ws = await websocket.websocket_connect(HTTPRequest(
                f"ws{self._base[4:]}api/kernels/{self._kernel}/channels"
                f"?session_id={uuid.uuid4().hex}", headers=self._auth(), request_timeout=30),
                ping_interval=20)
        except (HTTPClientError, OSError) as e:
            self._cleanup()
            raise ServerUnavailable(f"the session's Jupyter server did not answer: {e}") from None
        await super().get(ref)

    async def _server_of(self, sid: str) -> tuple[str, object]:
        username = await self.manager.db_read(
            lambda db: db.get(User, self.principal.user_id).username)
        user = self.find_user(username)
        for name, spawner in list((user.spawners if user else {}).items()):
            if getattr(spawner, "session_id", None) != sid:
                continue
            # The session runs before JupyterHub has seen its server answer: wait for that.
            deadline = asyncio.get_running_loop().time() + 120
            while spawner.pending == "spawn" and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
            if spawner.ready:
                self._token = user.new_api_token(
                    scopes=[f"access:servers!server={user.name}/{name}"], expires_in=3600,
                    note=f"backend.ai run in {name}")
                return spawner.server.url.rstrip("/") + "/", spawner
        raise InvalidRequest("this interactive session is not a running JupyterHub server "
                             "of yours, so it has no Jupyter kernel to run code in")

    def _auth(self) -> dict:
        return {"Authorization": f"token {self._token}"}

    async def _ensure_kernel(self) -> str:
        client = AsyncHTTPClient()
        kid = _KERNELS.get(self._sid)
        if kid:
            try:
                await client.fetch(f"{self._base}api/kernels/{kid}", headers=self._auth(),
                                   request_timeout=30)
                return kid
            except HTTPClientError as e:
                if e.code != 404:
                    raise
        r = await client.fetch(f"{self._base}api/kernels", method="POST", body="{}",
                               headers={**self._auth(), "Content-Type": "application/json"},
                               request_timeout=60)
        kid = _KERNELS[self._sid] = json.loads(r.body)["id"]
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
            await AsyncHTTPClient().fetch(
                f"{self._base}api/kernels/{self._kernel}/interrupt", method="POST", body="",
                headers=self._auth(), request_timeout=10)
        except Exception:
            self.log.debug("interrupting kernel %s failed", self._kernel, exc_info=True)

    def _cleanup(self):
        if self._kernel_ws is not None:
            self._kernel_ws.close()
            self._kernel_ws = None
        if self._token:
            from jupyterhub import orm

            tok = orm.APIToken.find(self.db, self._token)
            if tok is not None:
                self.db.delete(tok)
                self.db.commit()
            self._token = None

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
        if mode != "query" or not isinstance(code, str):
            self._finish_failed(f"mode {mode!r} is not supported by this server (only query: "
                                "run -c CODE; files need session upload)", 2)
            return
        self._session = uuid.uuid4().hex
        msg = self._kernel_msg("shell", "execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": True, "stop_on_error": True})
        msg_id = json.loads(msg)["header"]["msg_id"]
        await self._kernel_ws.write_message(msg)
        reply, idle, error = None, False, None
        try:
            while reply is None or not idle:
                raw = await self._kernel_ws.read_message()
                if raw is None:
                    self._finish_failed("the session's Jupyter kernel went away")
                    return
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
        except websocket.WebSocketClosedError:
            return
        code = _exit_code(reply, error)
        if code == 0:
            self._send(_record("finished", exit_code=0))
            self.close()
        else:
            why = (f"SystemExit({code})" if (error or {}).get("ename") == "SystemExit"
                   else f"{(error or reply).get('ename', 'error')}")
            self._finish_failed(why, code)
