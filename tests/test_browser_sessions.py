"""Issue 29, sessions on "My sessions" and in the console, in headless Chromium against a
real hub on the Docker engine:

- the user's own live use (CPU of the cores it asked for, memory of its limit) from the
  agent's kernel statistics, refreshed on the page;
- countdowns to the idle timeout and the lifetime's end (the keypair policy's);
- "Extend" within the policy's max_lifetime_extension: bad minutes refused in the row,
  a refusal of the API in its words, nothing changed; an extension moves the end;
- "Restart": the same resources and folders, a new session; the old one listed as
  finished with its end time, how long it ran and why it ended;
- a domain admin extends the user's session from the console; a user may not touch the
  console; no console errors.

Screenshots go to $BACKENDAI_TEST_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import datetime as dt
import re
import time

import pytest
from sqlalchemy import select

from jupyterhub_backendai.models import Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import KERNEL_IMAGE, Hub
from .test_pages import _user

pytestmark = [pytest.mark.browser, pytest.mark.docker]
LIFETIME, IDLE, EXTENSION = 3600, 1800, 1800


@pytest.fixture(scope="module")
def world(tmp_path_factory, docker_image):
    d = tmp_path_factory.mktemp("browser-sessions")
    url = f"sqlite:///{d}/backendai.sqlite"
    hub = Hub(db_url=url, backend="docker", slots={"cpu": 2, "mem": "4g"},
              extra_env={"BACKENDAI_START_TIMEOUT": "90"},
              extra_args=["--JupyterHub.slow_spawn_timeout=0"]).start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        sa.ok("POST", "/keypair-resource-policies", json={
            "name": "timed", "max_session_lifetime": LIFETIME, "idle_timeout": IDLE,
            "max_lifetime_extension": EXTENSION})
        w = {"hub": hub, "sa": sa}
        w["user"] = _user(sa, "sessuser", "user", "default")
        w["dadmin"] = _user(sa, "sessdadmin", "admin", "default")
        sa.ok("PATCH", f"/keypairs/{w['user']['keypair']['access_key']}",
              json={"resource_policy": "timed"})
        w["user"]["client"].ok("POST", "/vfolders", json={"name": "labdata"})
        r = hub.spawn("sessuser", "work", {"image": KERNEL_IMAGE, "cpu": "0.5", "mem": "512m",
                                           "mounts": ["labdata"]})
        assert r.status_code in (201, 202), r.text
        hub.wait_ready("sessuser", "work")
        yield w
    finally:
        hub.engine.dispose()
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _tab(browser, hub, email, password=PASSWORD):
    return logged_in(browser, hub, email, password, accept_dialogs=True,
                     hub_errors_only=True, locale="en-US")


def _running(hub, name="work") -> Session:
    with hub.sm() as s:
        return s.scalars(select(Session).where(Session.name == name,
                                               Session.status == "RUNNING")).one()


def _seconds_left(row, which: str) -> int:
    el = row.locator(f".backendai-{which}-ends .backendai-countdown")
    el.wait_for()
    page = row.page
    page.wait_for_function("el => el.dataset.secondsLeft !== undefined", arg=el.element_handle())
    assert re.fullmatch(r"in (\d+ h( \d+ min)?|\d+ min( \d+ s)?|\d+ s)", el.inner_text()), \
        el.inner_text()
    return int(el.get_attribute("data-seconds-left"))


def test_user_sees_live_use_countdowns_and_extends_within_the_policy(world, browser):
    hub = world["hub"]
    sess = _running(hub)
    ctx, page, errors = _tab(browser, hub, world["user"]["email"])
    try:
        page.goto(hub.base + "/hub/backendai/sessions")
        row = page.locator(f'tr[data-session-id="{sess.id}"]')
        # Live use: the agent samples with its heartbeat; the page refreshes the cell.
        mem = row.locator('[data-usage="mem"] .backendai-usage-text')
        mem.wait_for(timeout=90_000)
        assert re.fullmatch(r"\d+(\.\d+)? [KMG]iB of 512 MiB", mem.inner_text()), mem.inner_text()
        cpu_sel = f'tr[data-session-id="{sess.id}"] [data-usage="cpu"] .backendai-usage-text'
        cpu = page.locator(cpu_sel)
        # The first sample has no CPU figure yet ("measuring"); the page's refresh puts
        # in new cells, so the test asks the document each time, not one element.
        page.wait_for_function(
            "sel => { const el = document.querySelector(sel); "
            "return el !== null && el.textContent !== 'measuring'; }",
            arg=cpu_sel, timeout=90_000)
        assert re.fullmatch(r"\d+\.\d\d of 0\.5 cores", cpu.inner_text()), cpu.inner_text()
        bars = row.locator(".backendai-usage [role=progressbar]")
        assert bars.count() == 2
        for i in range(2):
            assert 0 <= int(bars.nth(i).get_attribute("aria-valuenow")) <= 100

        # Countdowns: the lifetime from RUNNING, the idle timeout from the last activity.
        running_since = dt.datetime.fromisoformat(sess.status_history["RUNNING"]).replace(
            tzinfo=dt.UTC)
        expected = LIFETIME - (dt.datetime.now(dt.UTC) - running_since).total_seconds()
        assert abs(_seconds_left(row, "lifetime") - expected) < 15
        assert 0 < _seconds_left(row, "idle") <= IDLE
        screenshot(page, "sessions-live-countdowns.png", full_page=True)

        form = row.locator("form.backendai-extend")
        assert "up to 30 min more" in form.inner_text()
        field = form.get_by_label("Minutes to add to work")
        error = form.locator(".backendai-extend-error")
        # Bad input: said in the row, nothing sent, nothing changed.
        for bad in ("abc", "0", "1.5", ""):
            field.fill(bad)
            field.press("Enter")
            error.wait_for(state="visible")
            assert error.inner_text() == f"Minutes must be a whole number of at least 1, not “{bad}”."
            assert field.get_attribute("aria-invalid") == "true"
        # Beyond the policy: the API's refusal in its words.
        field.fill("45")
        form.get_by_role("button", name="Extend").click()
        page.wait_for_function(
            "el => el.textContent.startsWith('session ')", arg=error.element_handle())
        assert error.inner_text() == (
            "session 'work' may be extended by at most 30 min more, not 45 min (keypair "
            "resource policy 'timed' allows 30 min in all; 0 s used)")
        assert _running(hub).lifetime_extension == 0
        screenshot(page, "sessions-extend-refused.png", full_page=True)

        before = _seconds_left(row, "lifetime")
        field.fill("20")
        field.press("Enter")
        page.locator("#backendai-message.alert-success").wait_for()
        assert page.locator("#backendai-message").inner_text().startswith("Extended by 20 min")
        assert _running(hub).lifetime_extension == 1200
        row = page.locator(f'tr[data-session-id="{sess.id}"]')
        assert abs(_seconds_left(row, "lifetime") - (before + 1200)) < 15
        assert "(extended 20 min)" in row.locator(".backendai-lifetime-ends").inner_text()
        assert "up to 10 min more" in row.locator("form.backendai-extend").inner_text()
        api = world["user"]["client"].ok("GET", f"/sessions/{sess.id}/lifetime")
        assert (api["extension"], api["extension_left"], api["lifetime"]) == (1200, 600, LIFETIME)
        screenshot(page, "sessions-extended.png", full_page=True)
        # The browser logs the one refusal asked for (the 45 minutes), nothing else.
        assert [e for e in errors if "status of 400 (Bad Request)" not in e] == []
        assert len(errors) == 1, errors
    finally:
        ctx.close()


def test_admin_extends_from_the_console_and_a_user_may_not(world, browser):
    hub = world["hub"]
    sess = _running(hub)
    used = sess.lifetime_extension
    ctx, page, errors = _tab(browser, hub, world["dadmin"]["email"])
    try:
        page.goto(hub.base + "/hub/backendai/admin/sessions")
        row = page.locator(f'tr[data-session-id="{sess.id}"]')
        assert _seconds_left(row, "lifetime") > 0
        field = row.get_by_label("Minutes to add to work")
        field.fill("2")
        field.press("Enter")
        page.locator("#backendai-message.alert-success").wait_for()
        assert _running(hub).lifetime_extension == used + 120
        screenshot(page, "console-sessions-extended.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()
    # Someone else's session: not even seen (404), nothing changed.
    other = _user(world["sa"], "sessother", "user", "default")
    r = other["client"]("POST", f"/sessions/{sess.id}/extend", json={"seconds": 60})
    assert r.status_code == 404, r.text
    assert _running(hub).lifetime_extension == used + 120


def test_restart_keeps_resources_and_folders_and_lists_the_old_session_as_finished(
        world, browser):
    hub = world["hub"]
    old = _running(hub)
    ctx, page, errors = _tab(browser, hub, world["user"]["email"])
    try:
        page.goto(hub.base + "/hub/backendai/sessions")
        row = page.locator(f'tr[data-session-id="{old.id}"]')
        row.get_by_role("button", name="Restart work").click()
        page.wait_for_url(re.compile(r"/hub/spawn-pending/sessuser/work|/user/sessuser/work/"),
                          timeout=180_000)
        hub.wait_ready("sessuser", "work")
        new = _running(hub)
        assert new.id != old.id
        assert new.requested_slots == old.requested_slots
        assert new.image == old.image
        assert [m["name"] for m in new.vfolder_mounts] == [m["name"] for m in old.vfolder_mounts]
        assert "labdata" in [m["name"] for m in new.vfolder_mounts]
        assert new.lifetime_extension == 0  # a new session, a new lifetime

        page.goto(hub.base + "/hub/backendai/sessions")
        ended = page.locator(f'tr[data-session-id="{old.id}"]')
        assert ended.locator(".backendai-status").inner_text() == "TERMINATED"
        with hub.sm() as s:
            rec = s.get(Session, old.id)
            ran = (rec.terminated_at - dt.datetime.fromisoformat(
                rec.status_history["RUNNING"])).total_seconds()
        moment = ended.locator(".backendai-ended time.backendai-time")
        assert dt.datetime.fromisoformat(moment.get_attribute("datetime").replace(
            "Z", "+00:00")) == rec.terminated_at.replace(tzinfo=dt.UTC)
        ran_text = ended.locator(".backendai-ran").inner_text()
        assert ran_text == (f"{int(ran)} s" if ran < 60 else f"{int(ran) // 60} min"), ran_text
        assert ended.locator(".backendai-exit-reason").inner_text() == rec.status_info
        assert rec.status_info  # why it ended, in words
        assert ended.locator(".backendai-restart").count() == 0
        assert ended.locator(".backendai-usage").inner_text() == "-"
        assert page.locator(f'tr[data-session-id="{new.id}"] .backendai-restart').count() == 1
        screenshot(page, "sessions-restarted.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()


def test_restart_of_a_batch_session_runs_it_again_with_the_same_request(world, browser):
    """A session that is not a JupyterHub server (a batch job made through the API):
    Restart in its row stops it and queues it again under its name with the same
    request (image, resources, folders, command); the old one ends TERMINATED,
    "restarted". A finished session has no Restart, and the API refuses one (409), as it
    refuses another user's (404), changing nothing."""
    hub, client = world["hub"], world["user"]["client"]
    job = client.ok("POST", "/sessions", json={
        "name": "job", "image": KERNEL_IMAGE, "resources": {"cpu": "0.25", "mem": "256m"},
        "startup_command": "echo started-$$ >> /home/work/labdata/runs.txt; sleep 600",
        "mounts": ["labdata"]})
    deadline = time.monotonic() + 120
    while client.ok("GET", f"/sessions/{job['id']}")["status"] != "RUNNING":
        assert time.monotonic() < deadline, client.ok("GET", f"/sessions/{job['id']}")
        time.sleep(0.5)
    stranger = _user(world["sa"], "sessstranger", "user", "default")
    other = stranger["client"]("POST", f"/sessions/{job['id']}/restart")
    assert other.status_code == 404, other.text
    ctx, page, errors = _tab(browser, hub, world["user"]["email"])
    new = None
    try:
        page.goto(hub.base + "/hub/backendai/sessions")
        row = page.locator(f'tr[data-session-id="{job["id"]}"]')
        with page.expect_navigation(timeout=180_000):
            row.get_by_role("button", name="Restart job").click()
        deadline = time.monotonic() + 120
        while True:
            with hub.sm() as db:
                new = db.scalars(select(Session).where(
                    Session.name == "job", Session.id != job["id"],
                    Session.status == "RUNNING")).one_or_none()
            if new is not None:
                break
            assert time.monotonic() < deadline, "the restarted job did not run"
            time.sleep(0.5)
        old = client.ok("GET", f"/sessions/{job['id']}")
        assert (old["status"], old["status_info"]) == ("TERMINATED", "restarted")
        again = client.ok("GET", f"/sessions/{new.id}")
        for key in ("image", "requested_slots", "startup_command", "type", "resource_group",
                    "cluster_size", "priority", "project_id"):
            assert again[key] == old[key], key
        assert [m["name"] for m in again["vfolder_mounts"]] == [
            m["name"] for m in old["vfolder_mounts"]]
        page.locator(f'tr[data-session-id="{new.id}"]').wait_for()  # listed at once
        page.reload()  # now that it runs, it may be restarted again
        page.locator(f'tr[data-session-id="{new.id}"] .backendai-restart').wait_for()
        assert page.locator(f'tr[data-session-id="{job["id"]}"] .backendai-restart').count() == 0
        refused = client("POST", f"/sessions/{job['id']}/restart")
        assert refused.status_code == 409 and "only a running session" in refused.text, \
            refused.text
        assert _running(hub, "job").id == new.id  # nothing changed by the refusals
        assert errors == []
    finally:
        ctx.close()
        if new is not None:
            client("DELETE", f"/sessions/{new.id}")


def test_extension_moves_the_end_the_lifecycle_keeps(world):
    """The lifecycle ends a session at its lifetime plus what was added: a 30 s lifetime
    extended by 40 s is still running at 40 s, and ended by its policy after 70 s with
    the extension in the reason."""
    hub, sa = world["hub"], world["sa"]
    sa.ok("POST", "/keypair-resource-policies", json={
        "name": "brief", "max_session_lifetime": 30, "max_lifetime_extension": 40})
    u = _user(sa, "briefuser", "user", "default")
    sa.ok("PATCH", f"/keypairs/{u['keypair']['access_key']}", json={"resource_policy": "brief"})
    r = hub.spawn("briefuser", "short", {"image": KERNEL_IMAGE, "cpu": "0.25", "mem": "256m"},
                  token=hub.token_for(u["web"], "briefuser"))
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("briefuser", "short")
    sess = _running(hub, "short")
    out = u["client"].ok("POST", f"/sessions/{sess.id}/extend", 200, json={"seconds": 40})
    assert out["extension"] == 40 and out["extension_left"] == 0
    r = u["client"]("POST", f"/sessions/{sess.id}/extend", json={"seconds": 1})
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == ("session 'short' cannot be extended: keypair resource "
                                  "policy 'brief' allows 40 s in all, all of it used")
    since = dt.datetime.fromisoformat(sess.status_history["RUNNING"]).replace(tzinfo=dt.UTC)
    while dt.datetime.now(dt.UTC) < since + dt.timedelta(seconds=40):
        time.sleep(1)
    with hub.sm() as s:
        assert s.get(Session, sess.id).status == "RUNNING"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with hub.sm() as s:
            rec = s.get(Session, sess.id)
            if rec.status == "TERMINATED":
                break
        time.sleep(1)
    assert rec.status == "TERMINATED", rec.status
    assert rec.status_info == ("reached max_session_lifetime (30 s, keypair policy, "
                               "extended by 40 s)")
    ended_after = (rec.terminated_at.replace(tzinfo=dt.UTC) - since).total_seconds()
    assert ended_after >= 70, ended_after
