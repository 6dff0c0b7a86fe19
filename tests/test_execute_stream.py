"""Issue 22, row 5: nothing is made for an execute websocket that will be refused, and a
user's open streams are capped (``api/compat/execute.py``).

The attack: ``ws://<hub>/.../stream/session/<id>/execute`` from another origin with the
victim's login cookie was refused (403), but only after the hub had minted a 1-hour
token and opened a websocket to the victim's Jupyter kernel, neither released: 92
refused attempts OOM-killed a 256 MiB session. Here 200 refused handshakes leave no
token, no kernel, no upstream connection and no growth of the server's memory.

A real hub (local backend: the session's Jupyter server is a process whose memory this
test reads), the victim's running server, real websockets.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from .api_world import PASSWORD, PREFIX, new_user, superadmin
from .conftest import _kill_local_kernels
from .hub import Hub


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request, tmp_path_factory):
    """A hub with alice's running server, on each database (the tokens a handshake could
    mint, and the access an open stream re-checks, live in the record)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('exec')}/backendai.sqlite"
    else:
        url = request.getfixturevalue("postgres").new_database("exec_" + uuid.uuid4().hex[:10])
    hub = Hub(db_url=url, backend="local").start()
    try:
        alice = new_user(superadmin(hub), name="victim")
        name = alice["username"]
        r = hub.spawn(name, "work", token=alice["token"])
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(name, "work", token=alice["token"])
        sessions = hub.api("GET", "/backendai/sessions", params={"user_id": alice["id"]})
        assert sessions.status_code == 200, sessions.text
        (sess,) = [s for s in sessions.json()["items"] if s["status"] == "RUNNING"]
        hub.alice, hub.sid = alice, sess["id"]
        yield hub
        hub.stop_server(name, "work", token=alice["token"])
    finally:
        hub.close()
        _kill_local_kernels(os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels"))


def _url(hub) -> str:
    return "ws" + hub.base[4:] + PREFIX + f"/stream/session/{hub.sid}/execute"


def _status(hub, headers: dict, origin: str | None) -> int:
    try:
        with connect(_url(hub), additional_headers=headers, origin=origin, open_timeout=60):
            return 101
    except InvalidStatus as e:
        return e.response.status_code


def _tokens(hub) -> list[str]:
    name = hub.alice["username"]
    r = hub.api("GET", f"/users/{name}/tokens")
    assert r.status_code == 200, r.text
    return sorted(t["id"] for t in r.json()["api_tokens"])


def _server(hub) -> tuple[str, dict]:
    """The victim's Jupyter server: its URL (through the hub) and a header to reach it."""
    name = hub.alice["username"]
    url = hub.server_model(name, "work", token=hub.alice["token"])["url"]
    return hub.base + url, {"Authorization": f"token {hub.alice['token']}"}


def _kernels(hub) -> list[dict]:
    base, auth = _server(hub)
    r = requests.get(base + "api/kernels", headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _server_rss(hub) -> int:
    """Resident memory (KiB) of the victim's Jupyter server process and its children."""
    states = os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels")
    (state,) = [f for f in os.listdir(states) if f.endswith(".json")]
    with open(os.path.join(states, state)) as f:
        pgid = int(json.load(f)["container_id"])
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            with open(f"/proc/{pid}/status") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue
    return total


def test_refused_handshakes_leave_nothing_behind(world):
    hub = world
    login = hub.login(hub.alice["email"], PASSWORD)
    cookie = "; ".join(f"{c.name}={c.value}" for c in login.cookies)
    tokens, kernels = _tokens(hub), _kernels(hub)
    assert kernels == []  # nothing has run code yet
    rss = _server_rss(hub)
    t0 = time.monotonic()
    for _ in range(200):
        assert _status(hub, {"Cookie": cookie}, "http://evil.example") == 403
    took = time.monotonic() - t0
    # Not one token, kernel or upstream connection was made for a refused handshake.
    assert _tokens(hub) == tokens
    assert _kernels(hub) == []
    grown = _server_rss(hub) - rss
    assert grown < 20 * 1024, f"the server grew by {grown} KiB over 200 refusals"
    # The same cookie from the hub's own origin opens it (the refusal was the origin's);
    # while open, it holds one token and one connection to a kernel.
    with connect(_url(hub), additional_headers={"Cookie": cookie}, origin=hub.base,
                 open_timeout=60) as ws:
        deadline = time.monotonic() + 30  # (open() runs after the handshake's answer)
        while [k["connections"] for k in _kernels(hub)] != [1]:
            assert time.monotonic() < deadline, _kernels(hub)
            time.sleep(0.1)
        assert len(_tokens(hub)) == len(tokens) + 1
        ws.send(json.dumps({"code": "1 + 1", "mode": "query", "options": {}}))
        while json.loads(ws.recv(timeout=60)).get("status") != "finished":
            pass
    # ...and what it opened is gone with it: its token at once, its kernel connection
    # as soon as the Jupyter server notices the close.
    assert _tokens(hub) == tokens
    deadline = time.monotonic() + 30
    while any(k["connections"] for k in _kernels(hub)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [k["connections"] for k in _kernels(hub)] == [0], _kernels(hub)
    print(f"200 refused handshakes in {took:.1f} s")


def test_open_streams_are_capped_per_user(world):
    from jupyterhub_backendai.api.compat.execute import MAX_STREAMS_PER_USER

    hub = world
    auth = {"Authorization": f"token {hub.alice['token']}"}
    tokens = _tokens(hub)
    streams = []
    try:
        for _ in range(MAX_STREAMS_PER_USER):
            streams.append(connect(_url(hub), additional_headers=auth, open_timeout=60))
        with pytest.raises(InvalidStatus) as e:
            connect(_url(hub), additional_headers=auth, open_timeout=60)
        assert e.value.response.status_code == 429
        assert b"execute streams open" in e.value.response.body
        streams.pop().close()
        # Closing one frees its place (the hub notices the close at once).
        deadline = time.monotonic() + 30
        while True:
            try:
                streams.append(connect(_url(hub), additional_headers=auth, open_timeout=60))
                break
            except InvalidStatus as e2:
                assert e2.response.status_code == 429
                assert time.monotonic() < deadline
                time.sleep(0.1)
        # A stream still runs code.
        ws = streams[-1]
        ws.send(json.dumps({"code": "print(6 * 7)", "mode": "query", "options": {}}))
        out = []
        while True:
            rec = json.loads(ws.recv(timeout=60))
            out += [c[1] for c in rec["console"]]
            if rec.get("status") == "finished" or rec.get("exitCode") not in (None, 0):
                break
        assert "".join(out).strip() == "42", out
    finally:
        for ws in streams:
            ws.close()
    # All closed: every token the streams held is gone.
    deadline = time.monotonic() + 30
    while _tokens(hub) != tokens and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _tokens(hub) == tokens


def test_an_open_stream_ends_with_the_access_it_was_opened_with(world):
    """Issue 22, derived credentials: a stream opened while the user was active does not
    outlive their deactivation. A run waiting for input is told why and closed within
    seconds, and the token the stream held is gone (before, it waited on until the
    client closed it)."""
    hub = world
    sa = superadmin(hub)
    bob = new_user(sa, name=f"streamer-{os.getpid()}")
    name = bob["username"]
    r = hub.spawn(name, "work", token=bob["token"])
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(name, "work", token=bob["token"])
    sessions = hub.api("GET", "/backendai/sessions", params={"user_id": bob["id"]})
    (sess,) = [s for s in sessions.json()["items"] if s["status"] == "RUNNING"]
    url = "ws" + hub.base[4:] + PREFIX + f"/stream/session/{sess['id']}/execute"
    auth = {"Authorization": f"token {bob['token']}"}
    with connect(url, additional_headers=auth, open_timeout=60) as ws:
        # A run that stays open: it waits for the user's input.
        ws.send(json.dumps({"code": "input('name? ')", "mode": "query", "options": {}}))
        while json.loads(ws.recv(timeout=60)).get("status") != "waiting-input":
            pass
        t0 = time.monotonic()
        sa.ok("PATCH", f"/users/{bob['id']}", json={"status": "inactive"})
        said = []
        try:
            while True:
                said += [c[1] for c in json.loads(ws.recv(timeout=30))["console"]]
        except Exception as e:  # the hub closed it
            said.append(f"<{type(e).__name__}: {e}>")
        took = time.monotonic() - t0
    assert any("access ended" in s for s in said[:-1]), said
    assert took < 15, f"the stream outlived the deactivation by {took:.1f} s"
    # The token the stream held is gone with it (bob's own tokens went with his access).
    r = hub.api("GET", f"/users/{name}/tokens")
    assert r.status_code == 200, r.text
    assert not [t for t in r.json()["api_tokens"] if "backend.ai run" in (t.get("note") or "")]
