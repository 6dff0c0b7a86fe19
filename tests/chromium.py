"""Headless Chromium for the browser tests: Debian's chromium driven by Playwright.

One place for the binary, its flags, the launch and the screenshots, so that every browser
test runs the same browser the same way (never ``playwright install``: it downloads).

**The browser runs in a network namespace of its own.** Chromium watches the host's
interfaces (netlink) and fails every request in flight with ``net::ERR_NETWORK_CHANGED``
when an address comes or goes. On a test machine the Docker engine makes and removes a
bridge with an address for every session network of every worker, so a browser on the
host's network lost a stylesheet, a settings request or a websocket now and then (a
JupyterLab "Error Loading Theme" dialog over the page, a launcher that never loaded). A
user's browser is on another machine and never sees the engine's interfaces; the tests'
browser now does not either. Its namespace holds only a loopback interface, on which the
test process listens with a SOCKS5 relay (:class:`LoopbackRelay`) that connects, from the
host's namespace, to loopback and nowhere else: ``localhost``, ``*.localhost`` and the
test's own ``--host-resolver-rules`` names resolve to 127.0.0.1, any other name or address
is refused. Making a namespace needs root (CI and this machine run as root); elsewhere the
browser shares the host's network, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fnmatch
import ipaddress
import itertools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator

import pytest

from .hub import REPO
from .services import RUN

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Screenshots the tests leave for a person to look at (CI keeps the folder).
ARTIFACTS = os.environ.get("BACKENDAI_TEST_ARTIFACTS", os.path.join(REPO, "test-artifacts"))

_CLONE_NEWNET = 0x40000000
_names = itertools.count()


def _resolver_rules(args) -> list[tuple[str, str]]:
    """``[(pattern, address)]`` from a ``--host-resolver-rules=MAP a b, MAP *.c d`` flag."""
    rules: list[tuple[str, str]] = []
    for arg in args:
        if arg.startswith("--host-resolver-rules="):
            for rule in arg.split("=", 1)[1].split(","):
                m = re.fullmatch(r"\s*MAP\s+(\S+)\s+(\S+)\s*", rule)
                if m:
                    rules.append((m.group(1).lower(), m.group(2)))
    return rules


class LoopbackRelay:
    """A SOCKS5 relay (CONNECT, no authentication) on a listening socket made inside the
    browser's namespace, connecting from the host's namespace to loopback only.

    Runs its own event loop in a thread: Playwright's sync API owns the test's."""

    def __init__(self, listener: socket.socket, rules: list[tuple[str, str]]):
        self.listener = listener
        self.rules = rules
        self.refused: list[str] = []  # destinations it would not reach, for a failing test
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="loopback-relay", daemon=True)
        self._ready = threading.Event()

    def address(self, host: str) -> str | None:
        """The loopback address ``host`` (a name or a literal) reaches, or None."""
        host = host.lower().rstrip(".")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            if host == "localhost" or host.endswith(".localhost"):
                return "127.0.0.1"
            for pattern, address in self.rules:
                if fnmatch.fnmatchcase(host, pattern):
                    return self.address(address)
            return None
        return str(ip) if ip.is_loopback else None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        try:
            version, n = await reader.readexactly(2)
            await reader.readexactly(n)
            if version != 5:
                return
            writer.write(b"\x05\x00")
            _, command, _, kind = await reader.readexactly(4)
            if kind == 1:
                host = socket.inet_ntoa(await reader.readexactly(4))
            elif kind == 3:
                host = (await reader.readexactly((await reader.readexactly(1))[0])).decode()
            elif kind == 4:
                host = socket.inet_ntop(socket.AF_INET6, await reader.readexactly(16))
            else:
                writer.write(b"\x05\x08\x00\x01" + bytes(6))
                return
            port = int.from_bytes(await reader.readexactly(2), "big")
            address = self.address(host)
            if command != 1 or address is None:
                self.refused.append(f"{host}:{port}")
                writer.write(b"\x05\x02\x00\x01" + bytes(6))  # not allowed by the ruleset
                return
            try:
                upstream = await asyncio.open_connection(address, port)
            except OSError:
                writer.write(b"\x05\x05\x00\x01" + bytes(6))  # connection refused
                return
            writer.write(b"\x05\x00\x00\x01" + bytes(6))
            await asyncio.gather(self._pipe(reader, upstream[1]), self._pipe(upstream[0], writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, sock=self.listener))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def start(self) -> LoopbackRelay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _listen_in(netns: str) -> socket.socket:
    """A TCP socket listening on 127.0.0.1 inside network namespace ``netns`` (a path):
    made by a thread that enters the namespace (setns is per thread), usable from any."""
    out: dict = {}

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            with open(netns) as target:
                if libc.setns(target.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(256)
            s.setblocking(False)
            out["socket"] = s
        except OSError as e:
            out["error"] = e

    t = threading.Thread(target=make)  # the thread ends in the namespace; nothing else runs on it
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["socket"]


@contextlib.contextmanager
def browser_netns(args) -> Iterator[tuple[str, list[str], LoopbackRelay] | None]:
    """A network namespace with a loopback relay for one browser:
    ``(executable, extra args, relay)``, or None where no namespace can be made (not root,
    no ``ip``); removed on leaving."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nsenter") is None:
        yield None
        return
    name = f"bt{RUN}-{os.getpid()}-{next(_names)}"
    path = f"/var/run/netns/{name}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        yield None
        return
    relay = None
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        relay = LoopbackRelay(_listen_in(path), _resolver_rules(args)).start()
        port = relay.listener.getsockname()[1]
        with tempfile.TemporaryDirectory(prefix="chromium-netns-") as d:
            wrapper = os.path.join(d, "chromium")
            with open(wrapper, "w") as f:
                f.write(f'#!/bin/sh\nexec nsenter --net={path} -- {CHROMIUM} "$@"\n')
            os.chmod(wrapper, 0o755)
            yield wrapper, [f"--proxy-server=socks5://127.0.0.1:{port}",
                            "--proxy-bypass-list=<-loopback>"], relay
    finally:
        if relay is not None:
            relay.stop()
            relay.listener.close()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def chromium(*extra_args: str, isolated: bool = True) -> Iterator:
    """A launched headless Chromium (Playwright's sync API), closed on leaving;
    ``extra_args`` go after the usual flags (``--host-resolver-rules=...``, which the
    relay honours too). ``isolated=False`` puts it on the host's network (only the test
    that shows why it is not, tests/test_chromium.py).

    A missing browser fails the test: it is a test dependency, not an optional one."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} missing (scripts/install-test-deps.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(browser_netns(extra_args)) if isolated else None
        executable, ns_args = (ns[0], ns[1]) if ns else (CHROMIUM, [])
        p = stack.enter_context(sync_api.sync_playwright())
        b = p.chromium.launch(executable_path=executable,
                              args=[*CHROMIUM_ARGS, *ns_args, *extra_args], headless=True)
        b.relay = ns[2] if ns else None
        try:
            yield b
        finally:
            b.close()


def console_error(m) -> bool:
    """Whether console message ``m`` is an error of the page's."""
    return m.type == "error"


def logged_in(browser, hub, email: str, password: str, *, accept_dialogs: bool = False,
              hub_errors_only: bool = False, **context):
    """A new browser context logged in to ``hub`` as ``email`` through its login form:
    ``(context, page, errors)``, ``errors`` collecting the page's console errors and
    uncaught exceptions (``hub_errors_only``: console errors of hub pages only, not of a
    user's server). ``accept_dialogs`` accepts every confirm(); ``context`` goes to
    ``new_context`` (locale, timezone_id, accept_downloads, viewport)."""
    import re

    ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **context})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []

    def console(m) -> None:
        if not console_error(m):
            return
        if hub_errors_only and "/hub/" not in page.url:
            return
        errors.append(f"{page.url}: {m.text}" if hub_errors_only else m.text)

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    if accept_dialogs:
        page.on("dialog", lambda dlg: dlg.accept())
    page.goto(hub.base + "/hub/login")
    page.fill("input[name=username]", email)
    page.fill("input[name=password]", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r"/hub/(spawn|home)"))
    return ctx, page, errors


def screenshot(page, path: str, **kwargs) -> None:
    """``page.screenshot`` that survives the page navigating on its own at that moment.

    A spawn's pending page goes on to the server by itself; Chromium then has no frame to
    capture and answers "Unable to capture screenshot". The picture is a record for a person,
    not an assertion, so wait for the next page to load and take it again (three tries).
    For the same reason a picture that does not come in its time (a full page under the
    load of two suites at once took longer than 60 s) fails no test whose assertions
    held: it is left out, with a warning that says so."""
    import warnings

    from playwright.sync_api import Error
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    if not os.path.isabs(path):
        path = os.path.join(ARTIFACTS, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for attempt in range(3):
        try:
            page.screenshot(path=path, **{"timeout": 120_000, **kwargs})
            return
        except PlaywrightTimeout as e:
            warnings.warn(f"screenshot {path} not taken: {str(e).splitlines()[0]}",
                          stacklevel=2)
            return
        except Error as e:
            if "Unable to capture screenshot" not in str(e) or attempt == 2:
                raise
            page.wait_for_load_state("load")
