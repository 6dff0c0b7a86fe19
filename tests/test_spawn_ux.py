"""What a person sees while starting a server: the form in human units and plain
words, every state of the session in the progress stream (replayed to a page that
connects late), the reason in the failure when a start times out waiting on a quota,
and the local backend's "unisolated" notice. Screenshots of the form, progress and
failure pages go to $BACKENDAI_TEST_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import json
import re
import threading
import time
from html.parser import HTMLParser

import pytest
import requests
from markupsafe import escape
from sqlalchemy import func, select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Agent, Keypair, KeypairResourcePolicy, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker
from jupyterhub_backendai.spawner import _UNISOLATED

from .hub import Hub

# JupyterHub's start_timeout for the module's hub: short, for the test of what a timeout
# says, yet with room for the other tests' whole spawns (a quota wait, then a server's
# start) on a loaded machine. At 30 s, test_every_state_shown_history_replayed_and_lab_loads
# failed once beside a second suite (load average 15; the run was stopped before its
# report, so the reason is not known; it passes alone in 55 s, most of it that spawn).
START_TIMEOUT = 60
STATES = ["pending", "scheduled", "preparing", "creating", "running"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """One local-backend hub for the module: 2 cores, 3 GiB, a short start timeout."""
    d = tmp_path_factory.mktemp("spawn-ux")
    h = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="local",
            slots={"cpu": 2, "mem": "3g"},
            extra_env={"BACKENDAI_START_TIMEOUT": str(START_TIMEOUT)})
    h.start()
    h.sm = make_sessionmaker(make_engine(h.db_url))
    assert h.admin_token
    yield h
    try:
        for u in h.api("GET", "/users").json():
            for name in list(u.get("servers", {})):
                h.stop_server(u["name"], name)
    finally:
        h.close()


def _events(hub, user: str, server: str, until=lambda e: False, limit: int = 50) -> list[dict]:
    """The server's progress stream (hub API), to its end or the first event ``until`` accepts."""
    url = hub.base + f"/hub/api/users/{user}/servers/{server}/progress"
    out: list[dict] = []
    with requests.get(url, headers={"Authorization": f"token {hub.admin_token}"},
                      stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                out.append(json.loads(line[5:]))
                if until(out[-1]) or out[-1].get("ready") or out[-1].get("failed") or len(out) >= limit:
                    break
    return out


def _nothing_left(hub):
    deadline = time.monotonic() + 30  # a stopped server's session ends just after
    while time.monotonic() < deadline:
        with hub.sm() as s:
            if not s.scalar(select(func.count()).select_from(Session).where(
                    Session.status == "TERMINATING")):
                break
        time.sleep(0.1)
    with hub.sm() as s:
        live = s.scalar(select(func.count()).select_from(Session).where(
            Session.status.notin_(["TERMINATED", "CANCELLED", "ERROR"])))
        assert live == 0
        assert s.get(Agent, hub.agent_id).occupied_slots.nonzero() == {}


def test_form_in_human_units_with_notice_and_no_gpu(hub):
    s = hub.login()
    r = s.get(hub.base + "/hub/spawn")
    assert r.status_code == 200
    text = r.text
    assert "Free on the largest agent now: 2 cores, 3 GiB memory" in text
    assert 'name="gpu"' not in text  # the group has no GPU slots
    assert "pattern=" not in text
    assert "unisolated: for demos only" in text
    assert 'name="mem"' in text and "512m, 2g or 1.5 GiB" in text


@pytest.mark.parametrize("mem, message", [
    ("300 GiB", "Memory: 300 GiB is more than the 3 GiB this resource group offers"),
    ("lots", "mem must be a size like 512m, 2g or 1.5 GiB, not &#39;lots&#39;"),
    ("1", "mem must be at least 64m (64 MiB), not 1 byte"),
])
def test_form_errors_are_plain_words(hub, mem, message):
    s = hub.login()
    r = s.post(hub.base + "/hub/spawn/admin/bad",
               data={"image": hub.image, "cpu": "1", "mem": mem, "_xsrf": s.cookies.get("_xsrf")})
    assert r.status_code == 400, r.text[-2000:]
    assert message in r.text, r.text[-3000:]
    assert "HTTP 400" not in r.text and "SpawnException" not in r.text
    _nothing_left(hub)


class _FormFields(HTMLParser):
    """The spawn form's field values as a browser would submit them (first of each name)."""

    def __init__(self):
        super().__init__()
        self.values: dict[str, str] = {}
        self._select: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "input" and a.get("type") == "radio":  # the checked one of its group
            if "checked" in a and a.get("name"):
                self.values.setdefault(a["name"], a.get("value") or "")
        elif tag == "input" and a.get("name") and a.get("type") != "checkbox":
            self.values.setdefault(a["name"], a.get("value") or "")
        elif tag == "select":
            self._select = a.get("name")
        elif tag == "option" and self._select and (
                "selected" in a or self._select not in self.values):
            self.values[self._select] = a.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None


def _form_fields(text: str) -> dict[str, str]:
    parser = _FormFields()
    parser.feed(text)
    return parser.values


def test_refused_form_keeps_what_the_user_entered(hub):
    """A refused submission shows the form again with the user's entries, not the
    defaults; the next visit starts from the defaults."""
    s = hub.login()
    url = hub.base + "/hub/spawn/admin/bad"
    defaults = _form_fields(s.get(url).text)
    # One resource group for this user: it is a hidden field of the form. The packaged
    # presets are offered as cards, "Custom" chosen (no preset is the default).
    assert defaults == {"resource_group": "default", "preset": "custom", "image": hub.image,
                        "cpu": "1", "mem": "1g", "cluster_size": "1",
                        "cluster_mode": "single-node"}, defaults
    entered = {"resource_group": "default", "image": hub.image, "cpu": "0.75", "mem": "1",
               "cluster_size": "2", "cluster_mode": "multi-node"}
    r = s.post(url, data={**entered, "_xsrf": s.cookies.get("_xsrf")})
    assert r.status_code == 400, r.text[-2000:]
    assert "mem must be at least 64m (64 MiB), not 1 byte" in r.text, r.text[-3000:]
    assert _form_fields(r.text) == {**entered, "preset": "custom"}
    assert _form_fields(s.get(url).text) == defaults
    _nothing_left(hub)


def test_api_errors_are_plain_words(hub):
    r = hub.spawn("admin", "bad", {"cpu": "5"})
    assert r.status_code == 400
    assert r.json()["message"] == "CPU: 5 cores is more than the 2 cores this resource group offers"
    r = hub.spawn("admin", "bad", {"mem": "1.5 GiB", "gpu": "1"})
    assert r.json()["message"] == "GPUs: this resource group has none (1 GPU requested)"
    _nothing_left(hub)


# The admin's keypair (policy "default") limited to 0.5 cores, which "holder" uses.
QUOTA_REASON = ("quota exceeded: your keypair's resource policy allows 0.5 cores in total; "
                "0.5 cores are in use and this session asks for 0.5 more "
                "(keypair policy 'default', total_resource_slots)")


class _Quota:
    """The admin's keypair policy limited to 0.5 cores while a "holder" server uses
    them, so that the next server waits PENDING on the quota until ``release()``."""

    def __init__(self, hub):
        self.hub = hub
        assert hub.spawn("admin", "holder", {"cpu": "0.5"}).status_code in (201, 202)
        hub.wait_ready("admin", "holder")
        with hub.sm.begin() as s:
            kp = s.scalar(select(Keypair).where(Keypair.is_active.is_(True)))
            self.policy = kp.resource_policy
            policy = s.get(KeypairResourcePolicy, self.policy)
            self.saved = dict(policy.total_resource_slots)
            policy.total_resource_slots = ResourceSlot(cpu="0.5")

    def release(self):
        with self.hub.sm.begin() as s:
            s.get(KeypairResourcePolicy, self.policy).total_resource_slots = ResourceSlot(self.saved)
        if self.hub.server_model("admin", "holder") is not None:
            self.hub.stop_server("admin", "holder")


def test_every_state_shown_history_replayed_and_lab_loads(hub):
    """The local backend as shipped: 1.5 GiB is accepted; the progress stream names the
    notice and every state (no "running: running"); a page connecting late gets the
    current state with its reason; JupyterLab's HTML comes back through the proxy."""
    quota = _Quota(hub)
    try:
        r = hub.spawn("admin", "", {"cpu": "0.5", "mem": "1.5 GiB"})
        assert r.status_code == 202, r.text
        live: list[dict] = []
        waiting = threading.Event()

        def follow():
            live.extend(_events(hub, "admin", "", until=lambda e: (
                e["message"].startswith("pending: quota exceeded") and waiting.set() and False)))

        t = threading.Thread(target=follow)
        t.start()
        assert waiting.wait(60), live
        late = _events(hub, "admin", "", until=lambda e: e["message"].startswith("pending"))
        assert [e["message"] for e in late][:2] == ["Server requested", _UNISOLATED], late
        assert late[-1]["message"] == "pending: " + QUOTA_REASON, late
        quota.release()
        t.join(60)
        assert not t.is_alive()
    finally:
        quota.release()
    messages = [e["message"] for e in live]
    assert live[-1].get("ready"), messages
    assert messages[1] == _UNISOLATED, messages
    assert not any(re.search(r"running: running", m) for m in messages), messages
    words = [m.split(":")[0] for m in messages if m.split(":")[0] in STATES]
    assert words == STATES, messages
    try:
        with hub.sm() as s:
            sess = s.scalar(select(Session).where(Session.name == "_default"))
            assert sess.requested_slots["mem"] == 3 * 2**29
        s = hub.login()
        lab = s.get(hub.base + "/user/admin/lab")
        assert lab.status_code == 200, lab.text[:500]
        assert "JupyterLab" in lab.text and "jupyter-config-data" in lab.text
    finally:
        hub.stop_server("admin", "")
    _nothing_left(hub)


def test_quota_timeout_failure_says_why(hub):
    """A server PENDING on its keypair quota past start_timeout fails with the quota
    reason in JupyterHub's own failure message; nothing is left behind."""
    quota = _Quota(hub)
    try:
        r = hub.spawn("admin", "quota", {"cpu": "0.5"})
        assert r.status_code == 202, r.text
        events = _events(hub, "admin", "quota")
        messages = [e["message"] for e in events]
        assert "pending: " + QUOTA_REASON in messages, messages
        final = events[-1]
        assert final.get("failed"), events
        assert final["message"].startswith(
            f"Spawn failed: The server did not start within {START_TIMEOUT} s; its session is still "
            "pending: " + QUOTA_REASON), final
        # The spawn-pending page (a late visitor) shows the same reason.
        s = hub.login()
        page = s.get(hub.base + "/hub/spawn-pending/admin/quota")
        assert str(escape(QUOTA_REASON)) in page.text, page.text[-3000:]
        assert "SpawnException" not in page.text
        with hub.sm() as s:
            assert s.scalar(select(Session.status).where(Session.name == "quota")) in ("CANCELLED", "TERMINATED")
    finally:
        quota.release()
    _nothing_left(hub)


@pytest.mark.parametrize("beside", [0, 4, 20])
def test_the_first_look_at_a_starting_server_waits_for_the_starts_beside_it(beside):
    """Issue 30: each look at a starting server (an HTTP request through the engine's
    port proxy) costs the hub and the proxy CPU the servers need, and beside others a
    server answers no sooner than they let it: the spawner's first look waits
    READY_HOLD per other start in flight on its agent (by the manager's wait for the
    session's changes, which an end cuts short), at most READY_HOLD_MAX, none for a
    start alone. The server here is a real HTTP server that answers at once; the
    manager stands in, saying how many starts are beside the server's agent."""
    import asyncio
    from types import SimpleNamespace

    from aiohttp import web

    from jupyterhub_backendai.spawner import READY_HOLD, READY_HOLD_MAX, BackendAISpawner

    events: list = []

    async def status(_request):
        events.append("look")
        return web.json_response({})

    async def wait_change(_sid, timeout):
        events.append(("wait", round(timeout, 3)))
        await asyncio.sleep(timeout)
        return set()

    async def get_session(_sid):
        return SimpleNamespace(status="RUNNING", status_info="")

    async def run():
        app = web.Application()
        app.router.add_get("/user/a/s/api", status)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        spawner = SimpleNamespace(
            ready_timeout=30, start_timeout=60, session_id="s1",
            manager=SimpleNamespace(
                starts_beside=lambda sid, agent: beside if (sid, agent) == ("s1", "n1") else -1,
                wait_change=wait_change, get_session=get_session, status_poll_interval=1.0))
        try:
            await BackendAISpawner._wait_http(
                spawner, f"http://127.0.0.1:{port}/user/a/s/api", time.monotonic() + 60, "n1")
        finally:
            await runner.cleanup()

    asyncio.run(run())
    if beside == 0:
        assert events == ["look"]
    else:
        hold = min(READY_HOLD * beside, READY_HOLD_MAX)
        assert events == [("wait", round(hold, 3)), "look"]
