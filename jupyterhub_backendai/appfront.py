"""The app front: nginx in front of the hub's proxy, with a fast path to session apps.

Opt-in (``c.JupyterHub.proxy_class = "backendai-front"``, or ``BACKENDAI_APP_FRONT=nginx``
with the packaged config). Every request goes to configurable-http-proxy (CHP) as before,
now listening on loopback behind nginx, except one kind: an HTTP request to an app a
session serves on a port, ``<server>/proxy/<port>/...`` and ``<server>/proxy/absolute/
<port>/...``, whose kernel container this host reaches directly. nginx sends those
straight to ``<container address>:<port>``, after asking the session's own Jupyter server
whether the request may pass:

- the question is nginx's ``auth_request``: the client's request line and headers (no
  body), through CHP to the session's Jupyter server, with ``X-Backendai-Auth-Probe:
  <method>``. jupyter-server-proxy's own ``prepare`` decides (the hub's token or login
  cookie, ``access:servers`` for this server, JupyterHub's sharing) and answers 204
  instead of proxying (``images/kernel/backendai_kernel_services.py``); the probe counts
  as activity of the server, as the request it stands for would;
- any other answer (401, 403, a redirect to log in, a stopped server), a websocket, an
  app that does not listen on the container's address (refused: 502), or a request line
  the front cannot map exactly sends the request the full way, through CHP and
  jupyter-server-proxy, so that the client gets exactly what it would get without the
  front;
- clients cannot ask the question themselves: nginx removes the header from every
  request it passes on.

Kernel addresses come from the spawner (:meth:`BackendAISpawner.app_address`, the
container's address on its session's bridge network); servers without one (other nodes,
the local backend) have no fast path. The fast locations are written when JupyterHub adds
a server's route and removed with it (nginx reloads its configuration; requests in flight
finish): a removal at once, additions together, at most one reload per 0.2 s for them.
Responses that took the fast path carry ``X-Backendai-App-Path: front``.

nginx runs as CHP does: started by the hub, outliving it (its pid file in the state
directory), stopped by ``stop()``. Its configuration and temporary files live in
``AppFrontProxy.state_dir``. Request bodies are not buffered (bodies pass as they arrive,
to the hub's and the server's own limits), nor are responses.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from urllib.parse import unquote, urlparse

from jupyterhub.proxy import ConfigurableHTTPProxy
from traitlets import Integer, Unicode, default

from .proxy import ClientPolicyRoutes

PROBE_HEADER = "X-Backendai-Auth-Probe"
PATH_HEADER = "X-Backendai-App-Path"
# Route prefixes the front writes into its configuration: anything else stays on CHP.
_SAFE_PREFIX = re.compile(r"^/[A-Za-z0-9._~@%+!&'()*,;=:/-]*/$")
_SAFE_HOST = re.compile(r"^[A-Za-z0-9.-]+$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _regex(text: str) -> str:
    """``text`` literally, as a PCRE inside nginx's double quotes."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


def _headers(upgrade: str, connection: str, probe: str = '""') -> str:
    """A location's request headers (nginx inherits none into a location that sets one).
    The probe header is always set: from a client it never passes."""
    return "\n".join(f"            proxy_set_header {name} {value};" for name, value in (
        ("Host", "$http_host"),
        ("X-Forwarded-For", "$proxy_add_x_forwarded_for"),
        ("X-Forwarded-Proto", "$scheme"),
        ("Upgrade", upgrade),
        ("Connection", connection),
        (PROBE_HEADER, probe),
    ))


class AppFrontProxy(ClientPolicyRoutes, ConfigurableHTTPProxy):
    """ConfigurableHTTPProxy behind nginx, with nginx's fast path to session apps."""

    nginx = Unicode("nginx", config=True, help="The nginx executable (1.9+, with auth_request).")
    state_dir = Unicode(
        config=True,
        help="nginx's configuration, pid file and temporary files (default: beside "
        "ConfigurableHTTPProxy.pid_file, else ./app-front).",
    )
    chp_port = Integer(
        0, config=True, help="CHP's port on 127.0.0.1 behind nginx (0: a free one at each start)."
    )
    worker_processes = Unicode("2", config=True, help="nginx's worker_processes.")

    @default("state_dir")
    def _state_dir_default(self):
        base = os.path.dirname(os.path.abspath(self.pid_file)) if self.pid_file else os.getcwd()
        return os.path.join(base, "app-front")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._chp_url = ""
        self._nginx_proc: subprocess.Popen | None = None
        # routespec -> (host or "", path prefix, kernel address)
        self._fast: dict[str, tuple[str, str, str]] = {}
        self._pending: asyncio.Future | None = None  # a reload the added routes wait for
        self._last_reload = float("-inf")  # the event loop's time of the last one
        self.reloads = 0  # configurations nginx was told to take

    # -- paths ----------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.state_dir, name)

    @property
    def _nginx_pid_file(self) -> str:
        return self._path("nginx.pid")

    # -- processes ------------------------------------------------------------

    async def start(self):
        """CHP on a loopback port, then nginx on the hub's public URL."""
        if not self._chp_url:
            self._chp_url = f"http://127.0.0.1:{self.chp_port or _free_port()}"
        if getattr(self.app, "internal_ssl", False):
            raise RuntimeError("AppFrontProxy: JupyterHub.internal_ssl is not supported (the "
                               "fast path would reach apps without it); use the plain proxy")
        # CHP listens on loopback without TLS; nginx takes the public URL (and TLS).
        public, cert, key = self.public_url, self.ssl_cert, self.ssl_key
        self.public_url, self.ssl_cert, self.ssl_key = self._chp_url, "", ""
        try:
            await super().start()
        finally:
            self.public_url, self.ssl_cert, self.ssl_key = public, cert, key
        await self._start_nginx()

    async def _start_nginx(self) -> None:
        if self._nginx_proc is not None and self._nginx_proc.poll() is None:
            self._reload()
            return
        if not shutil.which(self.nginx):
            raise RuntimeError(f"AppFrontProxy: nginx not found ({self.nginx!r}); install nginx "
                               "(Debian: nginx-light) or use the plain proxy")
        self._stop_previous_nginx()
        self._write_conf()
        self.log.info("Starting the app front (nginx) @ %s, CHP @ %s", self.public_url,
                      self._chp_url)
        with open(self._path("nginx-error.log"), "ab") as err:
            self._nginx_proc = subprocess.Popen(
                [self.nginx, "-p", self.state_dir, "-c", self._path("nginx.conf")],
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
        host, port = self._listen_addr()
        for _ in range(200):
            if self._nginx_proc.poll() is not None:
                raise RuntimeError("the app front (nginx) exited at start: "
                                   + self._tail(self._path("nginx-error.log")))
            try:
                socket.create_connection((host or "127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise TimeoutError("the app front (nginx) did not listen on " + self.public_url)

    @staticmethod
    def _tail(path: str) -> str:
        try:
            with open(path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def _stop_previous_nginx(self) -> None:
        """An nginx of an earlier hub (its pid file), stopped as CHP's is."""
        try:
            with open(self._nginx_pid_file) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"nginx" not in f.read():
                    return
            os.kill(pid, signal.SIGTERM)
        except OSError:
            return
        self.log.warning("Stopped the app front (nginx) of an earlier hub [%d]", pid)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.05)

    def stop(self):
        super().stop()
        proc = self._nginx_proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        else:
            self._stop_previous_nginx()

    async def check_running(self):
        await super().check_running()
        if self._nginx_proc is not None and self._nginx_proc.poll() is not None:
            self.log.error("The app front (nginx) exited (%s); starting it again",
                           self._nginx_proc.poll())
            self._nginx_proc = None
            await self._start_nginx()

    # -- routes ---------------------------------------------------------------

    async def add_route(self, routespec, target, data):
        await super().add_route(routespec, target, data)
        address = await self._address_for(data or {})
        host, _, path = routespec.partition("/")
        prefix = "/" + path
        new = None
        if address and _SAFE_PREFIX.match(prefix) and (not host or _SAFE_HOST.match(host)):
            new = (host, prefix, address)
        old = self._fast.pop(routespec, None)
        if new is not None:
            self._fast[routespec] = new
        if old is not None and old != new:
            # The route's old address goes (replaced, or no fast path now): at once, as
            # at a removal.
            self._reload()
        elif new is not None and old is None:
            await self._reload_together()

    async def delete_route(self, routespec):
        await super().delete_route(routespec)
        if self._fast.pop(routespec, None) is not None:
            # At once: the server's container and network go next, and its address may
            # soon be another session's.
            self._reload()

    async def _address_for(self, data: dict) -> str | None:
        app = self.app
        name, server = data.get("user"), data.get("server_name")
        if app is None or name is None or server is None:
            return None
        try:
            user = app.users[name]
        except KeyError:
            return None
        if server not in user.spawners:
            return None
        lookup = getattr(user.spawners[server], "app_address", None)
        if lookup is None:
            return None
        try:
            return await lookup()
        except Exception as e:  # the full path still works: no fast one for this server
            self.log.warning("app front: no kernel address for %s/%s: %s", name, server, e)
            return None

    # Added routes wait at most this long for a reload of their own; those added in the
    # meantime share it.
    RELOAD_GAP = 0.2

    async def _reload_together(self) -> None:
        """A reload for an added route, shared with the routes added around it.

        Each reload makes nginx start new workers and keep the old ones until their
        connections close (a websocket may take hours). A hub that starts adds the route
        of every running server at once: with one reload each, a thousand servers meant
        a thousand reloads and as many generations of workers. Routes added within
        ``RELOAD_GAP`` of the last reload (or of each other) share the next one; the
        caller returns once it is done. Until then the server's apps answer the full way
        (through CHP), the same as before its fast path existed."""
        loop = asyncio.get_running_loop()
        if self._pending is None:
            self._pending = loop.create_future()
            loop.call_later(max(0.02, self._last_reload + self.RELOAD_GAP - loop.time()),
                            self._reload_pending)
        await asyncio.shield(self._pending)

    def _reload_pending(self) -> None:
        if self._pending is not None:  # else a reload at once took the routes with it
            try:
                self._reload()
            except Exception:
                pass  # the routes waiting for it raise it

    def _reload(self) -> None:
        """Write the configuration; a running nginx takes it. The fast locations live in
        this process only: a restarted hub starts CHP and nginx afresh, and JupyterHub
        adds the routes of the running servers again."""
        waiting, self._pending = self._pending, None
        self._last_reload = asyncio.get_running_loop().time()  # every caller runs in the loop
        try:
            self._write_conf()
            if self._nginx_proc is not None and self._nginx_proc.poll() is None:
                self._nginx_proc.send_signal(signal.SIGHUP)
                self.reloads += 1
        except Exception as e:
            if waiting is not None:
                waiting.set_exception(e)
            raise
        if waiting is not None:
            waiting.set_result(None)

    # -- configuration --------------------------------------------------------

    def _listen_addr(self) -> tuple[str, int]:
        u = urlparse(self.public_url)
        return (u.hostname or ""), (u.port or (443 if u.scheme == "https" else 80))

    def _write_conf(self) -> None:
        os.makedirs(self._path("tmp"), mode=0o700, exist_ok=True)
        tmp = self._path("nginx.conf.tmp")
        with open(tmp, "w") as f:
            f.write(self.render_conf())
        os.replace(tmp, self._path("nginx.conf"))

    def render_conf(self) -> str:
        host, port = self._listen_addr()
        listen = f"{host}:{port}" if host else str(port)
        if ":" in host:
            listen = f"[{host}]:{port}"
        tls = ""
        if self.ssl_cert:
            listen += " ssl"
            tls = (f"    ssl_certificate {self.ssl_cert};\n"
                   f"    ssl_certificate_key {self.ssl_key};\n")
        chp = urlparse(self._chp_url)
        d = self.state_dir
        user = f"user {pwd.getpwuid(os.getuid()).pw_name};\n" if os.getuid() == 0 else ""
        by_host: dict[str, list[tuple[str, str]]] = {}
        routes = sorted(self._fast.values(), key=lambda r: -len(r[1]))
        # Sorted (host, prefix) pairs: those under one (host, path) are adjacent, so a
        # bisection finds them (a linear scan per route made this quadratic in servers).
        ordered = sorted((h, p) for h, p, _ in routes)
        for h, prefix, address in routes:
            # A server whose route lies below this one's proxy/ (a named server called
            # "proxy") owns those paths: no fast path that would take them.
            below = prefix + "proxy/"
            i = bisect.bisect_left(ordered, (h, below))
            if i < len(ordered) and ordered[i][0] == h and ordered[i][1].startswith(below):
                continue
            by_host.setdefault(h, []).append((prefix, address))
        servers = [self._server(listen, "", by_host.pop("", []), default=True)]
        servers += [self._server(listen, h, fast) for h, fast in sorted(by_host.items())]
        body = "\n".join(servers)
        return f"""# Written by jupyterhub_backendai.appfront (the hub rewrites it): do not edit.
{user}daemon off;
worker_processes {self.worker_processes};
pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    server_tokens off;
    merge_slashes off;
    # No stricter than CHP (node's 16 KiB of headers): long cookies pass.
    large_client_header_buffers 4 16k;
{tls}    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    # The hub and each server limit bodies themselves (before authentication too).
    client_max_body_size 0;
    proxy_request_buffering off;
    proxy_buffering off;
    proxy_buffer_size 1m;
    proxy_buffers 4 1m;
    proxy_busy_buffers_size 2m;
    # Apps answer through nginx: none may steer it (an internal redirect to another
    # location, its buffering or rate) with nginx's own response headers.
    proxy_ignore_headers X-Accel-Redirect X-Accel-Expires X-Accel-Limit-Rate
                         X-Accel-Buffering X-Accel-Charset;
    proxy_http_version 1.1;
    proxy_read_timeout 1h;
    proxy_send_timeout 1h;
    map $http_upgrade $bai_connection {{ default upgrade; "" ""; }}
    upstream bai_chp {{ server {chp.hostname}:{chp.port}; keepalive 64; }}
{body}
}}
"""

    def _server(self, listen: str, host: str, fast: list[tuple[str, str]], default=False) -> str:
        chp = _headers("$http_upgrade", "$bai_connection")
        out = [f"    server {{\n        listen {listen}{' default_server' if default else ''};"]
        out.append(f"        server_name {host or '_'};")
        out.append(f"""        location / {{
            proxy_pass http://bai_chp;
{chp}
        }}
        location @bai_chp {{
            proxy_pass http://bai_chp$request_uri;
{chp}
        }}""")
        if not fast:
            out.append("    }")
            return "\n".join(out)
        # The probe's question: the client's method (the probe's own is GET) and the server
        # the fast location stands for (only that server may answer yes), set there. (Not
        # in the server block: a subrequest runs its rewrites again and would reset them.)
        out.append(f"""        location = /_backendai_app_front_auth {{
            internal;
            proxy_pass http://bai_chp$request_uri;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
{_headers('""', '""', probe='"$bai_method $bai_server"')}
        }}""")
        for prefix, address in fast:
            for absolute in (True, False):
                out.append(self._fast_location(prefix, address, absolute))
        out.append("    }")
        return "\n".join(out)

    @staticmethod
    def _fast_location(prefix: str, address: str, absolute: bool) -> str:
        seg = "proxy/absolute/" if absolute else "proxy/"
        raw = _regex(prefix + seg)  # as the client sent it
        decoded = _regex(unquote(prefix) + seg)  # nginx matches locations on the decoded path
        # Named captures: nginx would escape numbered ones ($1) once more.
        if absolute:  # the app sees the whole path
            pick = f'if ($request_uri ~ "^{raw}(?<bai_port>\\d+)/") {{ set $bai_rest $request_uri; }}'
        else:  # the app sees the path after the port
            pick = f'if ($request_uri ~ "^{raw}(?<bai_port>\\d+)(?<bai_rest>/.*)$") {{ }}'
        return f"""        location ~ "^{decoded}\\d+/" {{
            error_page 418 = @bai_chp;
            if ($http_upgrade) {{ return 418; }}
            set $bai_method $request_method;
            set $bai_server "{prefix}";
            set $bai_port "";
            set $bai_rest "";
            {pick}
            if ($bai_rest = "") {{ return 418; }}
            if ($request_uri ~ "\\x5c") {{ return 418; }}
            auth_request /_backendai_app_front_auth;
            error_page 401 403 500 502 503 504 = @bai_chp;
            proxy_connect_timeout 2s;
            proxy_pass http://{address}:$bai_port$bai_rest;
{_headers('""', '""')}
            add_header {PATH_HEADER} front always;
        }}"""
