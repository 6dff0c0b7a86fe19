"""The tests' own port hand-out (tests/services.py): ports a browser may open, never the
same port to two threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from . import services


def test_no_port_chromium_refuses_is_handed_out():
    """A hub given 4045 could not be opened in Chromium (net::ERR_UNSAFE_PORT; seen in a
    fresh-clone run): the unsafe ports in the band are never handed out."""
    assert not any(services._port_free(p) for p in services.CHROMIUM_UNSAFE)
    _, size = services._worker_band(services._FREE_BAND)
    seen = {services.free_port() for _ in range(size)}  # the whole band, in turn
    assert not seen & services.CHROMIUM_UNSAFE, sorted(seen & services.CHROMIUM_UNSAFE)


def test_threads_asking_at_once_get_distinct_ports():
    got: list[int] = []
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        got.extend(services.free_port() for _ in range(20))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 160


def test_two_suites_at_once_never_hand_out_one_port(tmp_path):
    """Two suites on one machine at once (stop 32's pair lost 14 module setups to
    EADDRINUSE): processes of one worker index, even of one run token, alive together,
    get disjoint ports and port blocks (their suite slots). A third at once has no slot
    left: it says so, and shares one as before slots. Each process is a real Python
    process of the suite's own hand-out, with a lock directory of this test's own."""
    code = ("import json, sys; from tests import services as s; "
            "print(json.dumps({'slot': getattr(s, 'suite_slot', lambda: None)(), "
            "'ports': [s.free_port() for _ in range(60)], "
            "'blocks': [s.port_block(200) for _ in range(3)]}), flush=True); "
            "sys.stdin.read()")
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw5", "BACKENDAI_TEST_RUN": "0badcafe",
           "BACKENDAI_TEST_LOCK_DIR": str(tmp_path)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = []
    try:
        got = []
        for _ in range(3):
            p = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
            procs.append(p)
            got.append(json.loads(p.stdout.readline()))
        first, second, third = got
        assert not set(first["ports"]) & set(second["ports"])
        assert {first["slot"], second["slot"]} == {0, 1}
        blocks = [set(range(b, b + 201)) for g in (first, second) for b in g["blocks"]]
        for i, a in enumerate(blocks):
            for b in blocks[i + 1:]:
                assert not a & b
        # The third: no slot of its own, and it says so.
        procs[2].stdin.close()
        assert procs[2].wait(10) == 0
        assert "held by other suites" in procs[2].stderr.read()
        assert third["slot"] in (0, 1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.stdin.close()
                p.wait(10)
