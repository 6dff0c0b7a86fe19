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
  (seconds to wait for the port), ``absolute_url``, ``new_browser_tab``;
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
        icon = os.path.join(ICONS, str(sdef.get("icon") or f"{name}.svg"))
        if os.path.isfile(icon):
            entry["launcher_entry"]["icon_path"] = icon
        servers[name] = entry
    return servers


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
    logdir = os.environ.get("BACKENDAI_TENSORBOARD_LOGDIR") or os.path.join(
        os.environ.get("HOME") or "/home/work", "logs")
    if "tensorboard" in c.ServerProxy.servers:
        try:
            os.makedirs(logdir, exist_ok=True)
        except OSError:
            pass


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


def _stream_or_buffer(original):
    async def _proxy_buffered(self, host, port, proxied_path, body, client):
        if self.rewrite_response:
            return await original(self, host, port, proxied_path, body, client)
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


def _load_jupyter_server_extension(serverapp) -> None:
    from jupyter_server_proxy.handlers import ProxyHandler

    _start_ssh_activity(serverapp)
    if getattr(ProxyHandler, "_backendai_502", False):
        return
    ProxyHandler._proxy_buffered = _stream_or_buffer(ProxyHandler._proxy_buffered)
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
    ProxyHandler._backendai_502 = True
    serverapp.log.info("backendai: service ports %s", sorted(serverapp.config.ServerProxy.servers))


def _jupyter_server_extension_points():
    return [{"module": "backendai_kernel_services"}]
