"""The tests' browser against the machine it runs on (tests/chromium.py).

Chromium fails every request in flight with ``net::ERR_NETWORK_CHANGED`` when an address
comes or goes on an interface it can see, and the Docker engine beside it makes a bridge
with an address for every session network. These tests make that happen, with a real
engine, while a request is in flight, and check that the tests' browser does not notice;
and that its relay reaches loopback only.
"""

from __future__ import annotations

import secrets
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .chromium import chromium
from .services import RUN, foreign_subnets

IMAGE = "backendai/debian-base:bookworm"

pytestmark = pytest.mark.browser


class _Held(BaseHTTPRequestHandler):
    """``/`` a page; ``/held?<n>`` answers only once the test lets it (``server.release``)."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.startswith("/held"):
            with self.server.lock:
                self.server.arrivals += 1
            self.server.release.wait(30)
            body = b"answered"
        else:
            body = b"<!doctype html><title>held</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def held_server():
    server = _held_server()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def _docker(*args: str) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _fetch_across_a_new_network(browser, server, n: int = 10) -> list[str]:
    """What ``n`` fetches in flight while the engine makes a bridge network end with:
    Chromium holds six connections to a host, so six wait at the server and the rest
    wait for a connection in the browser."""
    page = browser.new_page()
    try:
        base = f"http://localhost:{server.server_port}"
        page.goto(base + "/")
        page.evaluate(f"""() => {{ window.held = Promise.all(Array.from({{length: {n}}},
            (_, i) => fetch('/held?' + i).then(r => r.text(), e => 'failed: ' + e))); }}""")
        deadline = time.monotonic() + 30
        while server.arrivals < 6:
            assert time.monotonic() < deadline, f"{server.arrivals} requests reached the server"
            time.sleep(0.02)
        name = f"bt{RUN}-{secrets.token_hex(3)}"
        (subnet,) = foreign_subnets()  # not a /16 of Docker's choice: the session pool
        net = _docker("network", "create", "--driver", "bridge", "--subnet", subnet, name)
        try:
            bridge = "br-" + net[:12]
            shown = subprocess.run(["ip", "-4", "addr", "show", bridge], capture_output=True,
                                   text=True).stdout
            assert "inet " in shown, f"{bridge} has no address: the fault did not happen"
            # A container on it: a veth pair comes up and the bridge with it.
            _docker("run", "--rm", "--network", net, "--label", f"ai.backend.agent-id={name}",
                    "--entrypoint", "true", IMAGE)
        finally:
            _docker("network", "rm", net)
        server.release.set()
        return page.evaluate("window.held")
    finally:
        page.close()


def _held_server() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Held)
    server.arrivals, server.lock, server.release = 0, threading.Lock(), threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_requests_in_flight_survive_the_engine_making_a_network():
    """The fault, performed: ten fetches are in flight (six held open by the server, four
    waiting for one of Chromium's six connections to the host) while the engine makes a
    bridge network, runs a container on it and removes it. The tests' browser, in a
    namespace of its own, gets every answer. The same browser on the host's network fails
    the waiting four (Chromium's ERR_NETWORK_CHANGED): that is how JupyterLab's theme,
    settings and launcher failed to load in browser tests beside other workers' sessions."""
    results = {}
    for isolated in (True, False):
        server = _held_server()
        try:
            with chromium(isolated=isolated) as browser:
                assert (browser.relay is not None) == isolated, \
                    "this machine cannot give the browser a namespace of its own (not root?)"
                results[isolated] = _fetch_across_a_new_network(browser, server)
        finally:
            server.release.set()
            server.shutdown()
            server.server_close()
    assert results[True] == ["answered"] * 10
    assert any(r.startswith("failed") for r in results[False]), \
        f"on the host's network the fault did not show: {results[False]}"


def test_the_relay_reaches_loopback_and_nothing_else(held_server):
    """The browser's only way out: loopback by address or ``*.localhost`` name; another
    address or name is refused at the relay, before any packet leaves."""
    from playwright.sync_api import Error

    with chromium() as browser:
        page = browser.new_page()
        port = held_server.server_port
        for url in (f"http://127.0.0.1:{port}/", f"http://admin.localhost:{port}/"):
            assert page.goto(url).status == 200
        for host in ("192.0.2.1", "example.com", "[2001:db8::1]"):
            with pytest.raises(Error):
                page.goto(f"http://{host}:{port}/", timeout=15_000)
        assert {r.rsplit(":", 1)[0] for r in browser.relay.refused} >= {
            "192.0.2.1", "example.com", "2001:db8::1"}
