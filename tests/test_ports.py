"""The tests' own port hand-out (tests/services.py): ports a browser may open, never the
same port to two threads."""

from __future__ import annotations

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
