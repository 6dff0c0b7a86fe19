"""Service ports of a Backend.AI-style kernel, as jupyter-server-proxy entries.

The image declares its service ports in the ``ai.backend.service-ports`` label
(``name:protocol:port[,...]``, Backend.AI's format); the agent passes the label's value
to the kernel as ``BACKENDAI_SERVICE_PORTS``. :func:`configure` (called from the image's
``jupyter_server_config.py``) turns every ``http`` port into a ``ServerProxy.servers``
entry with a JupyterLab launcher tile, reachable at ``<server base url><name>/``:

- how to launch it comes from ``/etc/backend.ai/service-defs/<name>.json`` (Backend.AI's
  place for it): ``command`` (list; ``{runtime_path}``, ``{home_dir}``,
  ``{tensorboard_logdir}``, ``{ports[0]}``/``{port}`` and ``{base_url}`` are filled in),
  optional ``title``, ``icon`` (a file in ``/opt/backendai/icons``), ``timeout``
  (seconds to wait for the port), ``absolute_url``, ``new_browser_tab``, and
  ``root_paths``: paths the app's pages name from the root of the host (TensorBoard's
  ``/font-roboto/``), which behind the proxy's prefix would leave the session (another
  origin with subdomains: blocked by the app's own ``font-src 'self'``); its HTML and
  CSS name them relative to the page instead (:func:`relative_root_paths`);
  jupyter-server-proxy starts the command on first use;
- without a service definition the port is proxied as is (the app must already run);
- the Jupyter server itself (the first port, and ``jupyter``, ``jupyterlab``,
  ``notebook``, ``ipython``, ``terminal``) is native: notebook and terminal tiles are
  JupyterLab's own; non-HTTP ports (``tcp``, ``pty``, ``preopen``) get no entry.

The server extension in this module (enabled by the same config) answers a proxied
request whose port has nothing listening with a plain 502 page that says so, instead of
jupyter-server-proxy's bare 500, and counts open SSH/SFTP connections to the kernel's
sshd (port 2200, which does not pass the proxy) as activity of the Jupyter server, so
that they keep the session from the idle timeout as proxied traffic does.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys

SERVICE_DEFS = os.environ.get("BACKENDAI_SERVICE_DEFS", "/etc/backend.ai/service-defs")
ICONS = "/opt/backendai/icons"
NATIVE = {"jupyter", "jupyterlab", "notebook", "ipython", "terminal"}
HTTP_PROTOCOLS = {"http"}


def parse_service_ports(label: str | None) -> list[tuple[str, str, int]]:
    """``name:protocol:port`` items, comma-separated; Backend.AI's ``name:proto:[p1,p2]``
    form is accepted too (the first port serves). Malformed items are skipped (logged
    by the caller), so one bad item never takes the Jupyter server down."""
    out = []
    for item in re.split(r",(?![^\[]*\])", label or ""):
        m = re.fullmatch(r"\s*([A-Za-z0-9][\w.-]*):(\w+):\[?\s*(\d+)[^\]]*\]?\s*", item)
        if m:
            out.append((m.group(1), m.group(2).lower(), int(m.group(3))))
    return out


def _fill(arg: str, values: dict[str, str]) -> str:
    # Fill our own placeholders; leave {port} and {base_url} to jupyter-server-proxy.
    arg = arg.replace("{ports[0]}", "{port}")
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def server_entries(label: str | None, defs_dir: str = SERVICE_DEFS) -> dict[str, dict]:
    """``ServerProxy.servers`` for the image's HTTP service ports (see module doc)."""
    home = os.environ.get("HOME") or "/home/work"
    values = {
        "runtime_path": os.environ.get("BACKENDAI_RUNTIME_PATH") or sys.executable,
        "home_dir": home,
        "tensorboard_logdir": os.environ.get("BACKENDAI_TENSORBOARD_LOGDIR")
        or os.path.join(home, "logs"),
    }
    ports = parse_service_ports(label)
    servers: dict[str, dict] = {}
    for idx, (name, proto, port) in enumerate(ports):
        if idx == 0 or name in NATIVE or proto not in HTTP_PROTOCOLS:
            continue
        try:
            with open(os.path.join(defs_dir, f"{name}.json")) as f:
                sdef = json.load(f)
        except FileNotFoundError:
            sdef = {}
        except (OSError, ValueError) as e:
            print(f"backendai: service-def {name!r} unreadable ({e}); proxying only",
                  file=sys.stderr)
            sdef = {}
        entry: dict = {
            "port": port,
            "absolute_url": bool(sdef.get("absolute_url", False)),
            "new_browser_tab": bool(sdef.get("new_browser_tab", True)),
            "timeout": int(sdef.get("timeout", 30)),
            "launcher_entry": {
                "enabled": True,
                "title": str(sdef.get("title") or name),
                "category": "Notebook",
            },
        }
        if sdef.get("command"):
            entry["command"] = [_fill(str(a), values) for a in sdef["command"]]
        if sdef.get("root_paths"):
            entry["rewrite_response"] = relative_root_paths([str(p) for p in sdef["root_paths"]])
        icon = os.path.join(ICONS, str(sdef.get("icon") or f"{name}.svg"))
        if os.path.isfile(icon):
            entry["launcher_entry"]["icon_path"] = icon
        servers[name] = entry
    return servers


def relative_root_paths(paths: list[str]):
    """A jupyter-server-proxy ``rewrite_response`` that turns ``url(/p``, ``"/p`` and
    ``'/p`` into ``url(p`` (and so on) in HTML and CSS responses, for each root path
    ``/p...`` in ``paths``: relative to the app's page, they stay below the proxy's
    prefix, where the app serves them. Served at the app's root (``<name>/``), as the
    launcher tile opens it."""
    pattern = re.compile(
        rb"""(url\(\s*["']?|["'])/(""" + b"|".join(re.escape(p.strip("/").encode()) + b"/"
                                                 for p in paths) + rb")")

    def rewrite(response):
        kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind in ("text/html", "text/css") and response.body:
            response.body = pattern.sub(rb"\1\2", response.body)

    return rewrite


def _cgroup_limits() -> tuple[int | None, float | None]:
    """The kernel's memory limit (bytes) and CPU limit (cores) from its cgroup (v2, then
    v1); None where there is none."""

    def read(path):
        try:
            with open(path) as f:
                return f.read().split()
        except OSError:
            return None

    mem = read("/sys/fs/cgroup/memory.max") or read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    mem_bytes = int(mem[0]) if mem and mem[0].isdigit() and int(mem[0]) < 1 << 60 else None
    cpu = read("/sys/fs/cgroup/cpu.max")
    if cpu is None:
        quota, period = read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), read(
            "/sys/fs/cgroup/cpu/cpu.cfs_period_us")
        cpu = quota and period and [quota[0], period[0]]
    cores = None
    if cpu and cpu[0].lstrip("-").isdigit() and int(cpu[0]) > 0 and int(cpu[1]) > 0:
        cores = int(cpu[0]) / int(cpu[1])
    return mem_bytes, cores


def resource_usage(c) -> None:
    """jupyter-resource-usage (JupyterLab's status bar: the server's memory and CPU)
    against the session's own limits: ``MEM_LIMIT``/``CPU_LIMIT`` as JupyterHub's
    spawner passes them (the session's request), the kernel's cgroup otherwise (sessions
    started through the API). The CPU limit is the request's, not the start-up burst
    the agent grants until the server answers."""
    mem, cores = _cgroup_limits()
    c.ResourceUseDisplay.track_cpu_percent = True
    if not os.environ.get("MEM_LIMIT") and mem:
        c.ResourceUseDisplay.mem_limit = mem
    if not os.environ.get("CPU_LIMIT") and cores:
        c.ResourceUseDisplay.cpu_limit = cores


def configure(c) -> None:
    """Apply the service ports and the proxy's limits to a Jupyter server config."""
    label = os.environ.get("BACKENDAI_SERVICE_PORTS")
    if label is None:
        try:
            with open("/etc/backend.ai/service-ports") as f:
                label = f.read().strip()
        except OSError:
            label = ""
    c.ServerProxy.servers = server_entries(label)
    # Proxy to the kernel itself only (never to other hosts: other kernels, the hub,
    # the cloud metadata service); jupyter-server-proxy's default, made explicit.
    c.ServerProxy.host_allowlist = ["localhost", "127.0.0.1"]
    # A LazyConfigValue: merged with the extensions enabled elsewhere.
    c.ServerApp.jpserver_extensions.update({"backendai_kernel_services": True})
    # TensorBoard's log directory (~/logs, Backend.AI's) is not made here: TensorBoard
    # serves a missing one as empty, and a folder nobody asked for in every home only
    # puzzled users. Writing logs there (tf.summary, torch's SummaryWriter) makes it.
    resource_usage(c)


# -- the 502 page ----------------------------------------------------------------------

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>502: nothing is listening on port {port}</title>
<style>body{{font-family:sans-serif;max-width:40em;margin:3em auto;line-height:1.5}}</style>
</head><body><h1>502: nothing is listening on port {port}</h1>
<p id="reason">No app answers on port {port} in this session{what}.</p>
<p>Start an app that listens on <code>127.0.0.1:{port}</code> (for example
<code>python -m http.server {port} --bind 127.0.0.1</code> in a terminal), then reload
this page.</p><p><small>{detail}</small></p></body></html>
"""


def _unreachable(exc) -> bool:
    from tornado import web
    from tornado.iostream import StreamClosedError

    # Refused, or (localhost resolving to ::1 without IPv6 in the container, tried last)
    # EADDRNOTAVAIL: any socket-level failure to reach the port.
    if isinstance(exc, (OSError, StreamClosedError)):
        return True
    return isinstance(exc, web.HTTPError) and exc.status_code == 599


def _port_of(handler) -> str:
    port = getattr(handler, "port", None)
    if port:
        return str(port)
    m = re.search(r"/proxy/(?:absolute/)?(\d+)", handler.request.path)
    return m.group(1) if m else "?"


# -- streamed responses ----------------------------------------------------------------

# Response headers never passed on as they came (jupyter-server-proxy's list); tornado
# frames the response itself.
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authenticate", "proxy-authorization", "proxy-connection"}

# How much of a response may be on its way to the client before the app is read again.
_WINDOW = 1 << 20
# Written to the client in pieces of at least this much (the app is read 64 KiB at a time).
_FLUSH = 256 << 10


async def _proxy_streamed(self, host, port, proxied_path, body, client):
    """jupyter-server-proxy's ``_proxy_buffered`` without the buffering.

    The stock handler reads the app's whole response into memory (tornado's HTTP client
    collects it, joins the pieces, hands it to the handler's write buffer) before it
    sends the first byte: every concurrent download of N bytes costs the session's
    Jupyter server N to 2N of memory, so 20 downloads of 10 MiB OOM-killed a 512 MiB
    session. Here what the app sends goes to the client as it comes (256 KiB at a time),
    and once 1 MiB is on its way the app is read again only when the client has
    taken it (the ``streaming_callback`` returns the flush's future, which tornado's
    HTTP/1 connection awaits): memory per download is about 1 MiB, whatever the size,
    and a slow client slows the app down instead of filling the server's memory.
    Status, headers (``Content-Length`` kept, so downloads show their progress; a
    redirect's ``Location`` rewritten as the stock handler does), activity recording
    and errors (an app that does not answer: the 502 page) are as before. Handlers with
    a ``rewrite_response`` (it needs the whole body) keep the stock path.
    """
    from tornado import httputil, web
    from tornado.httpclient import HTTPError as ClientHTTPError

    head: dict = {"first": None, "lines": [], "sent": False}

    def header_callback(line: str) -> None:
        if line.startswith("HTTP/"):
            # A new status line (after a 100 Continue, say): start over.
            head["first"], head["lines"] = line, []
        elif line.strip():
            head["lines"].append(line)

    def send_head() -> None:
        if head["sent"] or head["first"] is None:
            return
        head["sent"] = True
        first = httputil.parse_response_start_line(head["first"].strip())
        self.set_status(first.code, first.reason)
        self._headers = httputil.HTTPHeaders()
        headers = httputil.HTTPHeaders.parse("".join(head["lines"]))
        # A HEAD response keeps the app's Content-Length (tornado sends no body for HEAD).
        bodyless = first.code in (204, 304) or 100 <= first.code < 200
        for name, value in headers.get_all():
            lname = name.lower()
            if lname in _HOP_BY_HOP or (lname == "content-length" and bodyless):
                continue
            if (lname == "location" and not self.absolute_url
                    and first.code in (301, 302, 303, 307, 308)):
                value = self._rewrite_location_header(value, host, port, proxied_path)
            self.add_header(name, value)

    def streaming_callback(chunk: bytes):
        send_head()
        self.write(chunk)
        # Hand the client _FLUSH bytes at a time (fewer, larger socket writes than one
        # per 64 KiB read); keep reading while less than _WINDOW bytes are on their way,
        # then wait until they are out (writes complete in order).
        head["buffered"] = head.get("buffered", 0) + len(chunk)
        if head["buffered"] < _FLUSH:
            return None
        head["unacked"] = head.get("unacked", 0) + head["buffered"]
        head["buffered"] = 0
        future = self.flush()
        if head["unacked"] >= _WINDOW:
            head["unacked"] = 0
            return future
        return None

    req = self._build_proxy_request(host, port, proxied_path, body,
                                    header_callback=header_callback,
                                    streaming_callback=streaming_callback)
    # The stock 300 s would bound the whole download (the client's speed included) now;
    # jupyter-server-proxy's own streaming mode (text/event-stream) allows 2 h.
    req.request_timeout = max(req.request_timeout or 0, 7200)
    self.log.debug("Proxying request to %s (streamed)", req.url)
    try:
        response = await client.fetch(req, raise_error=False)
    except Exception as err:
        self._record_activity()
        if not head["sent"]:
            if isinstance(err, ClientHTTPError) and err.code == 599:
                raise web.HTTPError(599, str(err)) from err
            raise  # e.g. connection refused: the 502 page
        # Part of the body is out (or the client went away): all that is left is to cut
        # the connection, so that the client sees a truncated response, never a
        # complete-looking one.
        self.log.warning("proxied response to %s cut: %s: %s", req.url,
                         type(err).__name__, err)
        self.request.connection.close()
        self._finished = True
        return
    finally:
        client.close()
    self._record_activity()
    if response.error and not isinstance(response.error, ClientHTTPError):
        raise web.HTTPError(500, str(response.error))
    if head["first"] is None:  # no status line seen (should not happen)
        head["first"] = f"HTTP/1.1 {response.code} {response.reason}"
    send_head()


# -- the direct path: pooled keep-alive connections to the app, splice for large bodies --

# Apps of a session listen on the kernel's loopback; these hosts are reached without a
# resolver (tornado's client resolves "localhost" in a worker thread for every request).
_LOOPBACK = {"localhost": ("127.0.0.1", "::1"), "127.0.0.1": ("127.0.0.1",), "::1": ("::1",)}
# Idle keep-alive connections kept per app port, and for how long.
_POOL_MAX = 64
_POOL_IDLE = 30.0
# A response body of a known length at least this large is moved by splice() (app socket
# -> pipe -> client socket, no copy through Python) once its head is out; the client's
# connection is closed after it. Smaller ones are read and written whole.
_SPLICE_MIN = 256 << 10
_PIPE_SIZE = 1 << 20
# Seconds a spliced transfer may make no progress (either side) before it is cut.
_SPLICE_IDLE = 300
# Transfers spliced at once (each holds a thread while it runs); more wait for a slot.
_SPLICE_THREADS = 64
_HEAD_MAX = 64 << 10
_IDEMPOTENT = {"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"}
_HEAD_END = re.compile(rb"\r?\n\r?\n")

# (ip, port) -> [(socket, time it was put back)]
_pool: dict = {}
_splice_slots: dict = {}


class _AppGone(Exception):
    """A reused keep-alive connection closed before any byte of the response."""


def _pool_get(addr):
    import socket
    import time

    idle = _pool.get(addr)
    now = time.monotonic()
    while idle:
        sock, since = idle.pop()
        if now - since < _POOL_IDLE:
            try:
                # Nothing may be waiting on an idle connection: stray bytes (an app that
                # sent more than it announced) or EOF (the app closed it) retire it, so one
                # request never reads what was meant for another.
                sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return sock
            except OSError:
                pass
        sock.close()
    return None


def _pool_put(addr, sock) -> None:
    import time

    idle = _pool.setdefault(addr, [])
    if len(idle) >= _POOL_MAX:
        sock.close()
        return
    idle.append((sock, time.monotonic()))


async def _connect(host: str, port: int, timeout: float):
    import asyncio
    import socket

    loop = asyncio.get_running_loop()
    err: Exception | None = None
    for ip in _LOOPBACK[host]:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (ip, port)), timeout)
        except (TimeoutError, OSError) as e:
            sock.close()
            err = e
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return (ip, port), sock
    if isinstance(err, asyncio.TimeoutError):
        raise ConnectionRefusedError(f"connecting to {host}:{port} timed out") from err
    raise err  # OSError: the 502 page


def _raw_capable(handler) -> bool:
    """A plain-TCP HTTP/1.1 client connection (TLS keeps tornado's path)."""
    import socket

    from tornado import iostream

    stream = getattr(handler.request.connection, "stream", None)
    return (type(stream) is iostream.IOStream and isinstance(stream.socket, socket.socket)
            and handler.request.version == "HTTP/1.1" and hasattr(os, "splice"))


def _splice_body(client, app, first: bytes, count: int) -> bool:
    """Send ``first``, then ``count`` more bytes from ``app`` to ``client`` by splice()
    (both blocking sockets with _SPLICE_IDLE kernel timeouts). True if all arrived at
    the app's side (so the app connection is at a clean boundary); raises on a client
    that left or stalled, returns False on an app that closed early."""
    import fcntl

    client.sendall(first)
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(w, 1031, _PIPE_SIZE)  # F_SETPIPE_SZ
        except OSError:
            pass
        src, dst = app.fileno(), client.fileno()
        flags = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_MORE", 4)
        left = count
        while left:
            n = os.splice(src, w, min(left, _PIPE_SIZE), flags=flags)
            if not n:
                return False
            left -= n
            while n:
                n -= os.splice(r, dst, n, flags=flags)
        return True
    finally:
        os.close(r)
        os.close(w)


async def _in_thread(fn, *args):
    """``fn(*args)`` in a daemon thread of its own (a transfer may hold it for long:
    never a worker of the shared executor), at most _SPLICE_THREADS at a time."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    slots = _splice_slots.get(loop)
    if slots is None:
        slots = _splice_slots[loop] = asyncio.Semaphore(_SPLICE_THREADS)
    fut = loop.create_future()

    def done(ok, value):
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def run():
        try:
            value = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(done, False, e)
        else:
            loop.call_soon_threadsafe(done, True, value)

    async with slots:
        threading.Thread(target=run, name="backendai-splice", daemon=True).start()
        return await fut


def _blocking(sock) -> None:
    import socket
    import struct

    sock.settimeout(None)
    tv = struct.pack("ll", _SPLICE_IDLE, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


async def _proxy_direct(self, host, port, proxied_path, body):
    """The app's response without tornado's HTTP client.

    - The request goes over a pooled keep-alive connection to the app (a fresh one for
      a method that is not idempotent, or when none is idle); ``localhost`` is the
      loopback, not resolved. A connection goes back to the pool only after a response
      read to its exact end (Content-Length or the last chunk), HTTP/1.1 without
      ``Connection: close``; an idle one with anything to read (stray bytes, EOF) is
      dropped, never handed to the next request.
    - The head is passed on as the stock handler does (hop-by-hop headers dropped,
      ``Location`` of redirects rewritten, ``Content-Length`` kept).
    - A body of known length >= _SPLICE_MIN to a plain HTTP/1.1 client: the client's
      connection is taken from tornado after the head, the body moved by splice() in a
      thread (no byte through Python), the connection closed after it
      (``Connection: close``). Smaller bodies: read whole, written at once. Chunked or
      close-delimited ones: streamed with the same backpressure as _proxy_streamed.
    - An app that breaks midway cuts the client's connection (a truncated response,
      never a complete-looking one); a client that leaves cuts the app's.
    """
    import asyncio
    from urllib.parse import urlsplit

    from tornado import httputil, web

    loop = asyncio.get_running_loop()
    req = self._build_proxy_request(host, port, proxied_path, body)
    url = urlsplit(req.url)
    target = (url.path or "/") + ("?" + url.query if url.query else "")
    method = req.method
    headers = req.headers
    lines = [f"{method} {target} HTTP/1.1"]
    for name, value in headers.get_all():
        if name.lower() not in ("content-length", "connection", "keep-alive"):
            lines.append(f"{name}: {value}")
    if "Host" not in headers:
        lines.append(f"Host: {url.netloc}")
    if req.body is not None:
        lines.append(f"Content-Length: {len(req.body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if req.body:
        data += req.body
    head_timeout = req.request_timeout or 300.0

    self._record_activity()
    for attempt in (0, 1):
        reused = None
        if method in _IDEMPOTENT and attempt == 0:
            for ip in _LOOPBACK[host]:
                reused = _pool_get((ip, int(port)))
                if reused is not None:
                    addr, sock = (ip, int(port)), reused
                    break
        if reused is None:
            addr, sock = await _connect(host, int(port), req.connect_timeout or 30.0)
        buf = bytearray()
        try:
            await loop.sock_sendall(sock, data)
            while True:  # the head (1xx heads skipped)
                m = _HEAD_END.search(buf)
                if m:
                    first_line, _, rest = bytes(buf[:m.start()]).partition(b"\n")
                    start = httputil.parse_response_start_line(
                        first_line.decode("latin-1").strip())
                    if 100 <= start.code < 200 and start.code != 101:
                        del buf[:m.end()]
                        continue
                    resp_headers = httputil.HTTPHeaders.parse(rest.decode("latin-1"))
                    del buf[:m.end()]
                    break
                if len(buf) > _HEAD_MAX:
                    raise web.HTTPError(502, "the app's response head is too large")
                chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), head_timeout)
                if not chunk:
                    if reused is not None and not buf:
                        raise _AppGone()
                    raise ConnectionResetError("the app closed the connection")
                buf += chunk
        except _AppGone:
            sock.close()
            continue
        except ConnectionError:  # reset, broken pipe, or closed before the head ended
            sock.close()
            if reused is not None and not buf and attempt == 0:  # (idempotent)
                continue
            raise
        except TimeoutError as e:
            sock.close()
            raise web.HTTPError(599, f"the app did not answer in {head_timeout:g} s") from e
        except BaseException:
            sock.close()
            raise
        break
    else:  # pragma: no cover (the second attempt never raises _AppGone)
        raise ConnectionResetError("the app closed the connection")

    try:
        await self._backendai_answer(sock, addr, buf, start, resp_headers, method,
                                     host, port, proxied_path)
    finally:
        self._record_activity()


async def _answer(self, sock, addr, buf, start, resp_headers, method, host, port,
                  proxied_path):
    import asyncio

    from tornado import httputil, iostream, web

    loop = asyncio.get_running_loop()
    code = start.code
    bodyless = method == "HEAD" or code in (204, 304) or 100 <= code < 200
    conn_tokens = {t.strip().lower() for t in resp_headers.get("Connection", "").split(",")}
    # (101: the connection is the app's other protocol now, never pooled.)
    keep = start.version == "HTTP/1.1" and "close" not in conn_tokens and code != 101
    chunked = "chunked" in resp_headers.get("Transfer-Encoding", "").lower()
    length = None
    if not bodyless and not chunked and "Content-Length" in resp_headers:
        values = {v.strip() for v in resp_headers.get_list("Content-Length")
                  for v in v.split(",")}
        if len(values) != 1 or not next(iter(values)).isdigit():
            sock.close()
            raise web.HTTPError(502, "the app sent an invalid Content-Length")
        length = int(values.pop())

    out = []
    for name, value in resp_headers.get_all():
        lname = name.lower()
        if lname in _HOP_BY_HOP or (lname == "content-length" and (bodyless and method != "HEAD"
                                                                    or chunked)):
            continue
        if (lname == "location" and not self.absolute_url
                and code in (301, 302, 303, 307, 308)):
            value = self._rewrite_location_header(value, host, port, proxied_path)
        out.append((name, value))

    def set_head():
        self.set_status(code, start.reason)
        self._headers = httputil.HTTPHeaders()
        for name, value in out:
            self.add_header(name, value)

    if bodyless or length is not None and length < _SPLICE_MIN:
        n = 0 if bodyless else length
        while len(buf) < n:
            try:
                chunk = await asyncio.wait_for(
                    loop.sock_recv(sock, max(65536, n - len(buf))), _SPLICE_IDLE)
            except BaseException:
                sock.close()
                raise
            if not chunk:
                sock.close()
                raise ConnectionResetError("the app closed the connection midway")
            buf += chunk
        if len(buf) == n and keep:
            _pool_put(addr, sock)
        else:
            sock.close()
        set_head()
        if n:
            self.write(bytes(buf[:n]))
        return

    if length is not None and _raw_capable(self):
        # Large, known length: the head by hand, then splice; the connection ends after.
        status = f"HTTP/1.1 {code} {start.reason or httputil.responses.get(code, 'Unknown')}"
        head = "\r\n".join([status] + [f"{k}: {v}" for k, v in out]
                           + ["Connection: close", "", ""]).encode("latin-1")
        first = bytes(buf[:length])
        stray = len(buf) > length
        stream = self.detach()
        try:
            if stream.closed() or stream.socket is None:  # the client left already
                sock.close()
                return
            fd = os.dup(stream.socket.fileno())
        finally:
            stream.close()
        import socket as _socket

        client = _socket.socket(fileno=fd)
        try:
            _blocking(client)
            _blocking(sock)
            clean = await _in_thread(_splice_body, client, sock, head + first,
                                     length - len(first))
            if clean:
                client.shutdown(_socket.SHUT_WR)
        except OSError as e:
            clean = False
            self.log.info("proxied response to port %s cut: %s", port, e)
        finally:
            # An orderly close also when cut (a reset makes CHP fail on its own error page
            # after the head went out): the client sees fewer bytes than Content-Length.
            client.close()
        if clean and keep and not stray:
            sock.setblocking(False)
            _pool_put(addr, sock)
        else:
            sock.close()
        return

    # Chunked, close-delimited, or large to a client we cannot take over: streamed.
    set_head()
    state = {"buffered": 0, "unacked": 0}

    async def relay(data: bytes) -> None:
        self.write(data)
        state["buffered"] += len(data)
        if state["buffered"] >= _FLUSH:
            state["unacked"] += state["buffered"]
            state["buffered"] = 0
            fut = self.flush()
            if state["unacked"] >= _WINDOW:
                state["unacked"] = 0
                if fut is not None:
                    await fut
                else:  # no future from flush(): the stream's own, done once all before it is out
                    stream = getattr(self.request.connection, "stream", None)
                    if stream is not None and not stream.closed():
                        await stream.write(b"")

    async def fill() -> bool:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), _SPLICE_IDLE)
        buf.extend(chunk)
        return bool(chunk)

    async def recv(n: int = 65536) -> bytes:
        if not buf and not await fill():
            return b""
        data = bytes(buf[:n])
        del buf[:n]
        return data

    clean = False
    try:
        if length is not None:
            await _relay_count(length, recv, relay)
            clean = not buf
        elif chunked:
            clean = await _relay_chunked(buf, fill, recv, relay)
        else:
            keep = False
            while True:
                data = await recv()
                if not data:
                    break
                await relay(data)
    except (TimeoutError, OSError, iostream.StreamClosedError, ValueError) as e:
        sock.close()
        self.log.warning("proxied response to port %s cut: %s: %s", port,
                         type(e).__name__, e)
        self.request.connection.close()
        self._finished = True
        return
    if clean and keep:
        _pool_put(addr, sock)
    else:
        sock.close()


async def _relay_count(count: int, recv, relay) -> None:
    """Pass exactly ``count`` bytes of the app's answer on to the client."""
    while count:
        data = await recv(min(count, 65536))
        if not data:
            raise ConnectionResetError("the app closed the connection midway")
        count -= len(data)
        await relay(data)


async def _relay_chunked(buf, fill, recv, relay) -> bool:
    """Pass a chunked body's data on (tornado chunks it again towards the client).
    True once the last chunk and the trailer are read and nothing follows."""

    async def line() -> bytes:
        while True:
            i = buf.find(b"\n")
            if i >= 0:
                data = bytes(buf[:i + 1])
                del buf[:i + 1]
                return data
            if len(buf) > 4096:
                raise ValueError("chunk size line too long")
            if not await fill():
                raise ConnectionResetError("the app closed the connection midway")

    while True:
        size_line = await line()
        size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
        if size == 0:
            while (await line()).strip():  # trailer
                pass
            return not buf
        await _relay_count(size, recv, relay)
        await line()  # the CRLF after the chunk


# -- websockets: the app's own handshake, then a byte relay -----------------------------

# Activity is recorded at most this often while a relayed websocket carries traffic.
_WS_ACTIVITY_EVERY = 1.0
# Once one direction of a relayed websocket has ended, the other gets this long to end.
_WS_LINGER = 30.0


def _ws_get(original_get):
    """``WebSocketHandlerMixin.get`` for a websocket upgrade to a kernel app, without
    tornado's websocket machinery in between.

    jupyter-server-proxy accepts the client's websocket itself, opens a second one to the
    app and passes every message across (parsed, unmasked, re-framed, in Python). Here,
    after the same checks (the hub's login in ``prepare``, run before; ``Connection:
    Upgrade``; the Origin check; the host allowlist, in ``proxy_open``; a named app's
    process started first, in ``open``), the client's handshake goes to the app as it
    came (with jupyter-server-proxy's request headers), and the app's answer comes back:
    a 101 passes on as is (the app chooses subprotocol and extensions), and from then on
    bytes are relayed both ways as they come. Anything else the app answers is passed on
    as an HTTP response. Unix-socket servers and TLS client connections keep the stock
    relay."""

    from tornado import web

    async def get(self, *args, **kwargs):
        headers = self.request.headers
        if (headers.get("Upgrade", "").lower() != "websocket" or self.unix_socket is not None
                or not _raw_capable(self)):
            return await original_get(self, *args, **kwargs)
        connection = {t.strip().lower() for t in headers.get("Connection", "").split(",")}
        if "upgrade" not in connection:
            raise web.HTTPError(400, '"Connection" must be "Upgrade".')
        origin = headers.get("Origin", headers.get("Sec-Websocket-Origin"))
        if origin is not None and not self.check_origin(origin):
            raise web.HTTPError(403, "Cross origin websockets not allowed")
        self._backendai_ws = {}
        await self.open(*args, **kwargs)  # -> proxy_open below: checks, records the target
        target = self._backendai_ws.get("target")
        if target is None:  # pragma: no cover (open always reaches proxy_open)
            raise web.HTTPError(500, "no websocket target")
        host, port, proxied_path = target
        await _relay_websocket(self, host, port, proxied_path)

    return get


def _ws_proxy_open(original):
    async def proxy_open(self, host, port, proxied_path=""):
        if getattr(self, "_backendai_ws", None) is None:
            return await original(self, host, port, proxied_path)
        from tornado import web

        if not self._check_host_allowlist(host) or host not in _LOOPBACK:
            raise web.HTTPError(403, "This host is not allowed.")
        self._backendai_ws["target"] = (host, port, proxied_path)

    return proxy_open


async def _relay_websocket(self, host, port, proxied_path):
    import asyncio
    import socket
    import time
    from urllib.parse import urlsplit

    from tornado import httputil, web

    loop = asyncio.get_running_loop()
    if not proxied_path.startswith("/"):
        proxied_path = "/" + proxied_path
    req = self._build_proxy_request(host, port, proxied_path, None)
    url = urlsplit(req.url)
    target = (url.path or "/") + ("?" + url.query if url.query else "")
    lines = [f"GET {target} HTTP/1.1"]
    for name, value in req.headers.get_all():
        if name.lower() not in ("content-length", "keep-alive", "te", "trailer",
                                "transfer-encoding", "proxy-connection",
                                "proxy-authorization", "proxy-authenticate"):
            lines.append(f"{name}: {value}")
    self._record_activity()
    addr, app = await _connect(host, int(port), req.connect_timeout or 30.0)
    try:
        await loop.sock_sendall(app, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        buf = bytearray()
        while not (m := _HEAD_END.search(buf)):
            if len(buf) > _HEAD_MAX:
                raise web.HTTPError(502, "the app's response head is too large")
            chunk = await asyncio.wait_for(loop.sock_recv(app, 65536),
                                           req.request_timeout or 300.0)
            if not chunk:
                raise ConnectionResetError("the app closed the connection")
            buf += chunk
        head = bytes(buf[:m.end()])
        first_line, _, rest = bytes(buf[:m.start()]).partition(b"\n")
        start = httputil.parse_response_start_line(first_line.decode("latin-1").strip())
        del buf[:m.end()]
    except TimeoutError as e:
        app.close()
        raise web.HTTPError(599, "the app did not answer the websocket handshake") from e
    except BaseException:
        app.close()
        raise
    if start.code != 101:  # refused by the app: its answer, as for any request
        resp_headers = httputil.HTTPHeaders.parse(rest.decode("latin-1"))
        await self._backendai_answer(app, addr, buf, start, resp_headers, "GET", host,
                                     port, proxied_path)
        return

    stream = self.detach()
    try:
        if stream.closed() or stream.socket is None:
            app.close()
            return
        # What the client sent beyond its handshake and tornado has read already (a
        # client waits for the 101, so normally nothing).
        buffered = getattr(stream, "_read_buffer_size", 0)
        early = await stream.read_bytes(buffered) if buffered else b""
        fd = os.dup(stream.socket.fileno())
    finally:
        stream.close()
    client = socket.socket(fileno=fd)
    client.setblocking(False)
    last = [0.0]

    def activity() -> None:
        now = time.monotonic()
        if now - last[0] >= _WS_ACTIVITY_EVERY:
            last[0] = now
            self._record_activity()

    async def pump(src, dst, pending: bytes) -> None:
        try:
            if pending:
                await loop.sock_sendall(dst, pending)
            while data := await loop.sock_recv(src, 65536):
                await loop.sock_sendall(dst, data)
                activity()
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    try:
        tasks = [asyncio.ensure_future(pump(app, client, head + bytes(buf))),
                 asyncio.ensure_future(pump(client, app, early))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.wait(pending, timeout=_WS_LINGER)
        for t in tasks:
            if not t.done():
                t.cancel()
            elif not t.cancelled() and t.exception() is not None:
                self.log.debug("websocket relay to port %s ended: %s", port, t.exception())
    finally:
        client.close()
        app.close()
        self._record_activity()


def _stream_or_buffer(original):
    async def _proxy_buffered(self, host, port, proxied_path, body, client):
        if self.rewrite_response:
            return await original(self, host, port, proxied_path, body, client)
        if host in _LOOPBACK and self.unix_socket is None:
            client.close()  # tornado's client, made by the caller: not used here
            return await _proxy_direct(self, host, port, proxied_path, body)
        return await _proxy_streamed(self, host, port, proxied_path, body, client)

    return _proxy_buffered


# -- SSH/SFTP as activity ---------------------------------------------------------------

SSH_PORT = 2200  # backendai-sshd.conf
# Seconds between looks at the kernel's TCP connections (two small /proc reads).
SSH_ACTIVITY_INTERVAL = 10.0
_PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")


def ssh_connections(port: int = SSH_PORT, files=_PROC_NET_TCP) -> int:
    """Established TCP connections to local ``port`` in this network namespace (the
    kernel's: the sshd's clients), from ``/proc/net/tcp`` and ``tcp6`` (state ``01``)."""
    suffix = f":{port:04X}"
    n = 0
    for path in files:
        try:
            with open(path) as f:
                next(f, None)  # header
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "01" and fields[1].endswith(suffix):
                        n += 1
        except OSError:
            continue
    return n


def _start_ssh_activity(serverapp) -> None:
    """Every SSH_ACTIVITY_INTERVAL s: while any SSH/SFTP connection is open, record
    activity as ``settings["backendai_ssh_last_activity"]`` (jupyter_server counts every
    setting ending in ``_last_activity`` in ``last_activity()``, which ``/api/status``
    answers and jupyterhub-singleuser reports to the hub, and so to the idle check)."""
    from jupyter_server._tz import utcnow
    from tornado.ioloop import PeriodicCallback

    settings = serverapp.web_app.settings
    if settings.get("backendai_ssh_activity_started"):
        return
    settings["backendai_ssh_activity_started"] = True

    def check() -> None:
        try:
            if ssh_connections():
                settings["backendai_ssh_last_activity"] = utcnow()
        except Exception:  # never take the server down for this
            serverapp.log.debug("backendai: ssh activity check failed", exc_info=True)

    PeriodicCallback(check, SSH_ACTIVITY_INTERVAL * 1000).start()


def _quiet_proxy_log(serverapp, handler_class) -> None:
    """No access-log work for a proxied request that succeeded: jupyter_server logs those
    at debug level only, yet formats them (and times them into its Prometheus histogram)
    every time; the app's own log has them. Errors and redirects, and everything when
    the server logs at debug level, are logged as before."""
    import logging

    settings = serverapp.web_app.settings
    original = settings.get("log_function")
    if original is None or getattr(original, "_backendai", False):
        return

    # The server's logger passes everything on (its handlers filter by --log-level), so
    # ask the server's setting, not the logger.
    if getattr(serverapp, "log_level", logging.INFO) <= logging.DEBUG:
        return

    def log_function(handler):
        if isinstance(handler, handler_class) and handler.get_status() < 300:
            return
        original(handler)

    log_function._backendai = True
    settings["log_function"] = log_function


# -- the app front's question --------------------------------------------------------

# Set by the hub's app front (nginx, jupyterhub_backendai/appfront.py) on the one
# request it sends before passing a client's request on straight to an app: the value
# is "<the client's method> <the server's base URL>". The answer is this handler's own
# verdict on the client's credentials (the same ``prepare``: the hub's token or login
# cookie, access scopes, sharing), as 204 when it would proxy; nothing is proxied. A
# question meant for another server is answered 409. The front drops this header from
# every client request, and falls back to the full path on any answer but 2xx.
PROBE_HEADER = "X-Backendai-Auth-Probe"
_PROBE_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}


def _probe_prepare(original):
    async def prepare(self, *args, **kwargs):
        probe = self.request.headers.get(PROBE_HEADER)
        if probe is None:
            return await original(self, *args, **kwargs)
        from tornado import web

        method, _, server = probe.partition(" ")
        if method.upper() not in _PROBE_METHODS:
            raise web.HTTPError(400, f"{PROBE_HEADER}: not a method")
        if server != self.base_url:
            raise web.HTTPError(409, f"{PROBE_HEADER}: meant for another server")
        self.request.method = method.upper()
        await original(self, *args, **kwargs)  # 403, or a redirect to log in
        if self._finished:
            return
        self._record_activity()  # the request passes straight to the app: it is activity
        self.set_header("Cache-Control", "no-store")
        self.set_status(204)
        self.finish()

    return prepare


def _load_jupyter_server_extension(serverapp) -> None:
    from jupyter_server_proxy.handlers import ProxyHandler

    _start_ssh_activity(serverapp)
    if getattr(ProxyHandler, "_backendai_502", False):
        return
    ProxyHandler._proxy_buffered = _stream_or_buffer(ProxyHandler._proxy_buffered)
    ProxyHandler.prepare = _probe_prepare(ProxyHandler.prepare)
    ProxyHandler._backendai_answer = _answer
    from jupyter_server_proxy.websocket import WebSocketHandlerMixin

    ProxyHandler.get = _ws_get(WebSocketHandlerMixin.get)
    ProxyHandler.proxy_open = _ws_proxy_open(ProxyHandler.proxy_open)
    original = ProxyHandler.write_error

    def write_error(self, status_code, **kwargs):
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if not _unreachable(exc):
            return original(self, status_code, **kwargs)
        port = _port_of(self)
        name = getattr(self, "name", None)
        self.set_status(502, "Bad Gateway")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(_PAGE.format(
            port=html.escape(port),
            what=f" (the {html.escape(name)} app)" if name else "",
            detail=html.escape(f"{type(exc).__name__}: {exc}"),
        ))

    ProxyHandler.write_error = write_error
    _quiet_proxy_log(serverapp, ProxyHandler)
    ProxyHandler._backendai_502 = True
    serverapp.log.info("backendai: service ports %s", sorted(serverapp.config.ServerProxy.servers))


def _jupyter_server_extension_points():
    return [{"module": "backendai_kernel_services"}]
