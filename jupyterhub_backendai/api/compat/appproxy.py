"""``backend.ai app SESSION APP`` and ``apps``: Backend.AI's local app proxy, through the hub.

The CLI listens on a local port (``-b``, 127.0.0.1:8080 by default) and, for every TCP
connection made to it, opens the websocket ``GET /stream/session/{id}/tcpproxy?app=NAME``
(signed like any request) and passes the connection's bytes both ways as binary
messages. ``GET /stream/session/{id}/apps`` lists what it may forward.

Here every app of an interactive session is served by the session's Jupyter server
(docs/service-ports.md): the first service port is the server itself, the others are
behind it at ``<server>/<name>/`` (jupyter-server-proxy). So an HTTP app's websocket is
bridged to that server, the way JupyterHub's proxy reaches it (its address inside the
hub's network), as HTTP/1.1: each request the local client sends is passed on with

- its target under the server's URL (``/lab`` -> ``/user/alice/work/lab``; a target
  already under it, as the server's own links are, stays; another app's under
  ``<server>/<name>/``),
- ``Authorization: token ...`` of a short-lived API token of the owner scoped to that one
  server (any ``Authorization`` the client sent is dropped), made when the websocket
  opens and deleted when it closes,

and its body as it came (``Content-Length`` or chunked); what the server answers goes
back unchanged. After a request that upgrades the connection (a websocket: JupyterLab's
kernels and terminals), bytes go both ways as they come. A ``tcp`` app the agent
published (the ``sshd`` of a resource group with SSH, issue 12) is bridged to its port
on the agent as plain bytes.

The session must be the caller's own running session (another user's, admins' included:
404, as for ``run``); a batch session has no Jupyter server, so only its published
``sshd``. The websocket lives only as long as that access
(the session runs, the keypair and the user stay active: checked every
:data:`.execute.ACCESS_CHECK` seconds) and a user has at most :data:`MAX_TUNNELS` open
at once in this hub process (a browser opens several connections per page).
"""

from __future__ import annotations

import asyncio
import urllib.parse

from tornado import websocket

from ...common.errors import InvalidRequest, NotFound
from ...common.types import SessionStatus
from .base import CompatBase
from .execute import TooManyStreams, _JupyterServer, access_ended

#: Open tunnels (websockets) of one user at once in this hub process; past it, 429.
MAX_TUNNELS = 64
#: The most bytes a request's head may take before it is refused.
MAX_HEAD = 64 * 1024
#: Bytes read from the app at a time.
CHUNK = 64 * 1024

_TUNNELS: dict[str, int] = {}


class _BadRequest(Exception):
    """The local client sent what is not HTTP/1.1 this relay passes on."""


class HTTPRelay:
    """The client's side of one HTTP/1.1 connection, rewritten request by request (see
    the module's doc). :meth:`feed` takes bytes as they come and answers the bytes to send
    to the server; :class:`_BadRequest` for what is not a request it can pass on."""

    def __init__(self, base_path: str, app_path: str, token: str) -> None:
        self.base = base_path if base_path.endswith("/") else base_path + "/"
        self.app = app_path if app_path.endswith("/") else app_path + "/"
        self.token = token
        self._buf = b""
        self._state = "head"  # head, body, chunk-size, chunk-data, trailer, raw
        self._left = 0

    def feed(self, data: bytes) -> bytes:
        if self._state == "raw":
            return data
        self._buf += data
        out: list[bytes] = []
        while self._buf:
            if self._state == "raw":
                out.append(self._buf)
                self._buf = b""
            elif self._state == "head":
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEAD:
                        raise _BadRequest("request head too large")
                    break
                head, self._buf = self._buf[:end], self._buf[end + 4:]
                out.append(self._rewrite(head))
            elif self._state in ("body", "chunk-data"):
                n = min(self._left, len(self._buf))
                out.append(self._buf[:n])
                self._buf, self._left = self._buf[n:], self._left - n
                if self._left == 0:
                    self._state = "head" if self._state == "body" else "chunk-size"
            else:  # chunk-size, trailer: one line at a time
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEAD:
                        raise _BadRequest("chunk line too long")
                    break
                line, self._buf = self._buf[:end], self._buf[end + 2:]
                out.append(line + b"\r\n")
                if self._state == "trailer":
                    if not line:
                        self._state = "head"
                    continue
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise _BadRequest("bad chunk size") from None
                if size < 0:
                    raise _BadRequest("bad chunk size")
                if size == 0:
                    self._state = "trailer"
                else:
                    self._state, self._left = "chunk-data", size + 2
        return b"".join(out)

    def _target(self, target: str) -> str:
        if target == "*":
            return target
        if not target.startswith("/"):  # absolute-form: its path and query
            parts = urllib.parse.urlsplit(target)
            if parts.scheme not in ("http", "https"):
                raise _BadRequest("bad request target")
            target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        if target.startswith(self.base) or target.split("?", 1)[0] == self.base[:-1]:
            return target
        return self.app[:-1] + target

    def _rewrite(self, head: bytes) -> bytes:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError:  # (latin-1 decodes any byte)
            raise _BadRequest("bad request head") from None
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest("not an HTTP/1.x request")
        method, target, version = parts
        if not method.isalpha() or any(c in target for c in "\r\n\0"):
            raise _BadRequest("bad request line")
        headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest("bad header line")
            headers.append((name, value.strip()))
        names = {n.lower(): v for n, v in headers}
        te = names.get("transfer-encoding")
        if te is not None and "content-length" in names:
            raise _BadRequest("both Content-Length and Transfer-Encoding")
        if te is not None and te.lower() != "chunked":
            raise _BadRequest(f"Transfer-Encoding {te!r} is not passed on (chunked is)")
        length = names.get("content-length", "0")
        if not length.isdigit():
            raise _BadRequest("bad Content-Length")
        kept = [(n, v) for n, v in headers if n.lower() != "authorization"]
        kept.append(("Authorization", f"token {self.token}"))
        upgrade = ("upgrade" in names
                   and "upgrade" in names.get("connection", "").lower())
        if upgrade:
            self._state = "raw"
        elif te is not None:
            self._state = "chunk-size"
        elif int(length):
            self._state, self._left = "body", int(length)
        line = f"{method} {self._target(target)} {version}"
        return ("\r\n".join([line] + [f"{n}: {v}" for n, v in kept]) + "\r\n\r\n").encode(
            "latin-1")


def _apps(rec: dict) -> list[dict]:
    """Backend.AI's app list of a session: its HTTP apps and its published TCP ports."""
    apps = []
    for sp in rec["ports"]:
        port = sp.get("container_port")
        entry = {"name": sp.get("name"), "protocol": sp.get("protocol"),
                 "ports": [port] if port is not None else []}
        if sp.get("protocol") == "http":
            entry["url_template"] = "http://{host}:{port}/"
        elif sp.get("protocol") != "tcp" or not sp.get("host_port"):
            continue
        apps.append(entry)
    return apps


class _OwnSession(_JupyterServer):
    async def _own_ports(self, ref: str) -> dict:
        """The caller's own running session ``ref`` and its service ports (a batch
        session's: only a published ``sshd``; its HTTP apps need a Jupyter server)."""
        ops = self.manager.ops
        sid = await ops.resolve_session(self.principal, ref)
        sess = await ops.get_session(self.principal, sid)
        if sess["user_id"] != self.principal.user_id:
            raise NotFound(f"no session {ref!r} of yours (apps are forwarded only from your "
                           "own sessions)")
        if sess["status"] != SessionStatus.RUNNING:
            raise InvalidRequest(f"session {sess['name']!r} is {sess['status']}, not RUNNING")
        self._sid = sid
        rec = await ops.session_service_ports(self.principal, sid)
        if rec["type"] != "interactive":
            rec["ports"] = [sp for sp in rec["ports"] if sp.get("protocol") == "tcp"]
        if not _apps(rec):
            # (a 4xx, not an empty list: on an app it does not find in the list, the
            # clients' `app` prints so and then waits forever, cli/app.py)
            raise InvalidRequest(
                f"session {sess['name']!r} has no apps to forward: apps are forwarded from "
                "an interactive session (its Jupyter server serves them), or the sshd of a "
                "session in a resource group with SSH")
        return rec


class AppsHandler(CompatBase, _OwnSession):
    """``GET /stream/session/{id}/apps``: the apps ``app`` may forward."""

    async def get(self, ref):
        rec = await self._own_ports(ref)
        self.reply(_apps(rec))


class TCPProxyHandler(websocket.WebSocketHandler, CompatBase, _OwnSession):
    """``GET /stream/session/{id}/tcpproxy?app=NAME`` (a websocket): one local connection
    of ``backend.ai app`` bridged to the app (see the module's doc). It reaches into the
    session as its owner: a JupyterHub token needs the write scope, though it is a GET."""

    grants_shell = True

    _counted: str | None = None
    _writer: asyncio.StreamWriter | None = None
    _pump: asyncio.Task | None = None
    _watch: asyncio.Task | None = None
    _relay: HTTPRelay | None = None

    def check_xsrf_cookie(self):
        return None

    async def get(self, ref):
        # Everything that can refuse is decided before the handshake is accepted.
        name = self.get_query_argument("app", "")
        for extra in ("arguments", "envs"):
            raw = self.get_query_argument(extra, "")
            if raw and raw not in ("{}", "null"):
                raise InvalidRequest(
                    f"{extra} of an app are not supported here: an app starts as its "
                    "image's service definition says (docs/service-ports.md)")
        if not name:
            raise InvalidRequest("name the app: ?app=NAME (`backend.ai apps SESSION -l`)")
        rec = await self._own_ports(ref)
        ports = rec["ports"]
        idx = next((i for i, sp in enumerate(ports) if sp.get("name") == name), None)
        app = ports[idx] if idx is not None else None
        offered = [a["name"] for a in _apps(rec)]
        if app is None or name not in offered:
            raise NotFound(f"session {ref!r} has no app {name!r} to forward (it offers: "
                           f"{', '.join(offered) or 'none'})")
        if app.get("protocol") == "http":
            await self._find_server()
            base = self._server.server.base_url
            url = urllib.parse.urlsplit(self._base)
            self._target = (url.hostname, url.port or 80)
            self._paths = (base, base if idx == 0 else f"{base.rstrip('/')}/{name}/")
        else:
            self._target, self._paths = (rec["host"], app["host_port"]), None
        uid = self.principal.user_id
        if _TUNNELS.get(uid, 0) >= MAX_TUNNELS:
            raise TooManyStreams(f"you have {MAX_TUNNELS} app proxy connections open (the "
                                 "most at once): close some first")
        _TUNNELS[uid] = _TUNNELS.get(uid, 0) + 1
        self._counted = uid
        try:
            await super().get(ref)
        finally:
            if self.ws_connection is None:  # refused at the handshake
                self._cleanup()

    async def open(self, ref):
        try:
            async with asyncio.timeout(30):
                reader, self._writer = await asyncio.open_connection(*self._target)
        except (OSError, TimeoutError) as e:
            self.close(1011, f"the app did not answer: {e}"[:120])
            self._cleanup()
            return
        if self._paths is not None:
            self._mint_token("app")
            self._relay = HTTPRelay(*self._paths, self._token)
        self._pump = asyncio.ensure_future(self._downstream(reader))
        self._watch = asyncio.ensure_future(self._watch_access())

    async def _downstream(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self.write_message(data, binary=True)
        except (OSError, websocket.WebSocketClosedError):
            pass
        self.close()
        self._cleanup()

    async def _watch_access(self) -> None:
        why = await access_ended(self.manager, self.principal, self._sid)
        self.close(1008, f"access ended: {why}"[:120])
        self._cleanup()

    async def on_message(self, message):
        if self._writer is None:
            return
        data = message if isinstance(message, bytes) else message.encode()
        try:
            if self._relay is not None:
                data = self._relay.feed(data)
            self._writer.write(data)
            await self._writer.drain()
        except _BadRequest as e:
            body = f"{e}\n".encode()
            await self.write_message(
                b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain"
                b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body), binary=True)
            self.close()
            self._cleanup()
        except OSError:
            self.close()
            self._cleanup()

    def on_close(self):
        self._cleanup()

    def _cleanup(self) -> None:
        for attr in ("_pump", "_watch"):
            task = getattr(self, attr)
            setattr(self, attr, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._drop_token()
        if self._counted is not None:
            left = _TUNNELS.get(self._counted, 1) - 1
            if left > 0:
                _TUNNELS[self._counted] = left
            else:
                _TUNNELS.pop(self._counted, None)
            self._counted = None


__all__ = ["AppsHandler", "HTTPRelay", "MAX_TUNNELS", "TCPProxyHandler"]
