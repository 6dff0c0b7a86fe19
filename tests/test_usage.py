"""Usage accounting that lasts (issue 29 point 7): core-, GiB- and GPU-hours from the
record, per user, project, domain and resource group, for any period; sessions that
span the period's edges counted only inside it; a user sees their own, an admin their
domain; the same figures after the hub restarts; the console's table and CSV.

A real hub on the local backend (PostgreSQL and SQLite: the figures come from the
database). Besides a session that really runs, sessions with known running times are
written into the record (as tests/test_pages.py parks sessions), so that the hours are
exact."""

from __future__ import annotations

import csv
import datetime as dt
import io
import uuid

import pytest

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Kernel, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, new_user, superadmin
from .chromium import chromium, console_error, screenshot
from .conftest import shutdown_hub
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

pytestmark = [pytest.mark.browser]
GIB = 1 << 30
UTC = dt.UTC
NOV = (dt.datetime(2024, 11, 1, tzinfo=UTC), dt.datetime(2024, 12, 1, tzinfo=UTC))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("usage")
    url = (f"sqlite:///{d}/backendai.sqlite" if request.param == "sqlite"
           else request.getfixturevalue("postgres").new_database("t_" + uuid.uuid4().hex[:12]))
    hub = Hub(db_url=url, backend="local", slots={"cpu": 4, "mem": "8g"},
              extra_env={"BACKENDAI_START_TIMEOUT": "60"}).start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        sa.ok("POST", "/domains", json={"name": "labb"})
        proj = sa.ok("POST", "/projects", json={"name": "vision", "domain_name": "default"})
        w = {"hub": hub, "sa": sa, "proj": proj, "db": request.param}
        w["ann"] = new_user(sa, name="ann", projects=[proj["id"]])
        w["bob"] = new_user(sa, name="bob")
        w["admin"] = new_user(sa, name="dadmin", role="admin")
        w["other"] = new_user(sa, name="carl", domain="labb", projects=[])
        # Known running times (UTC):
        # ann, vision: 2 cores + 4 GiB + 1 GPU, Oct 31 22:00 - Nov 1 02:00 (4 h, 2 in Nov)
        _ran(hub, w["ann"], "a1", proj["id"], [{"cpu": 2, "mem": 4 * GIB, "cuda.device": 1}],
             dt.datetime(2024, 10, 31, 22, tzinfo=UTC), dt.datetime(2024, 11, 1, 2, tzinfo=UTC))
        # ann: two kernels of 1 core + 1 GiB, Nov 10 10:00 - 13:00 (3 h)
        _ran(hub, w["ann"], "a2", None, [{"cpu": 1, "mem": GIB}, {"cpu": 1, "mem": GIB}],
             dt.datetime(2024, 11, 10, 10, tzinfo=UTC), dt.datetime(2024, 11, 10, 13, tzinfo=UTC))
        # bob: 0.5 core + 2 GiB, Nov 30 23:00 - Dec 1 01:00 (2 h, 1 in Nov)
        _ran(hub, w["bob"], "b1", None, [{"cpu": "0.5", "mem": 2 * GIB}],
             dt.datetime(2024, 11, 30, 23, tzinfo=UTC), dt.datetime(2024, 12, 1, 1, tzinfo=UTC))
        # bob: cancelled before it ran: no hours at all
        _ran(hub, w["bob"], "b2", None, [{"cpu": 4, "mem": GIB}], None,
             dt.datetime(2024, 11, 5, tzinfo=UTC))
        # carl in another domain: 1 core, Nov 2 00:00 - 10:00 (10 h)
        _ran(hub, w["other"], "c1", None, [{"cpu": 1, "mem": GIB}],
             dt.datetime(2024, 11, 2, tzinfo=UTC), dt.datetime(2024, 11, 2, 10, tzinfo=UTC))
        yield w
    finally:
        hub.engine.dispose()
        shutdown_hub(hub)


def _ran(hub, user, name, project, kernels, began, ended) -> str:
    """A session that ran from ``began`` to ``ended`` with ``kernels``' slots (None:
    cancelled before it ran), as the lifecycle records one."""
    with hub.sm.begin() as s:
        total = ResourceSlot()
        for k in kernels:
            total = total + ResourceSlot(k)
        history = {"PENDING": (began or ended).isoformat()}
        if began:
            history["RUNNING"] = began.isoformat()
        status = "TERMINATED" if began else "CANCELLED"
        history[status] = ended.isoformat()
        sess = Session(
            name=name, session_type="batch", user_id=user["id"],
            access_key=user["keypair"]["access_key"], domain_name=user["domain_name"],
            project_id=project, resource_group="default", image="local/python",
            startup_command="true", status=status, status_history=history,
            requested_slots=total, created_at=began or ended, terminated_at=ended)
        for i, k in enumerate(kernels):
            sess.kernels.append(Kernel(status=status, cluster_idx=i + 1,
                                       requested_slots=ResourceSlot(k), terminated_at=ended))
        s.add(sess)
        s.flush()
        return sess.id


def _rows(report) -> dict[str, tuple]:
    return {r["name"]: (r["sessions"], r["hours"], r["cpu_hours"], r["mem_gib_hours"],
                        r["gpu_hours"]) for r in report["items"]}


def _usage(client, **q):
    return client.ok("GET", "/usage", params={"start": NOV[0].isoformat(),
                                              "end": NOV[1].isoformat(), **q})


def test_hours_per_user_project_domain_group_cut_at_the_periods_edges(world):
    sa = world["sa"]
    got = _usage(sa, group_by="user")
    assert _rows(got) == {
        # a1: 2 h x (2 cores, 4 GiB, 1 GPU); a2: 3 h x (2 cores, 2 GiB)
        "ann": (2, 5.0, 10.0, 14.0, 2.0),
        "carl": (1, 10.0, 10.0, 10.0, 0.0),
        "bob": (1, 1.0, 0.5, 2.0, 0.0),  # b2 never ran
    }
    assert [r["name"] for r in got["items"]] == ["ann", "carl", "bob"]  # most core-hours first
    # (these sessions are written into the record, not run: nothing was sampled)
    assert got["total"] == {"sessions": 4, "hours": 16.0, "cpu_hours": 20.5,
                            "mem_gib_hours": 26.0, "gpu_hours": 2.0, "sampled_hours": 0.0,
                            "used_cpu_hours": 0.0, "used_mem_gib_hours": 0.0,
                            "used_gpu_hours": 0.0}
    assert _rows(_usage(sa, group_by="project")) == {
        "default/vision": (1, 2.0, 4.0, 8.0, 2.0),
        "(no project)": (3, 14.0, 16.5, 18.0, 0.0)}
    assert _rows(_usage(sa, group_by="domain")) == {
        "default": (3, 6.0, 10.5, 16.0, 2.0), "labb": (1, 10.0, 10.0, 10.0, 0.0)}
    assert _rows(_usage(sa, group_by="resource_group")) == {"default": (4, 16.0, 20.5, 26.0, 2.0)}
    # Two adjacent periods add up to the one around them (a1 spans Oct/Nov).
    octnov = sa.ok("GET", "/usage", params={"start": "2024-10-01", "end": "2024-12-01",
                                            "group_by": "user"})
    octo = sa.ok("GET", "/usage", params={"start": "2024-10-01", "end": "2024-11-01",
                                          "group_by": "user"})
    assert _rows(octo) == {"ann": (1, 2.0, 4.0, 8.0, 2.0)}
    assert _rows(octnov)["ann"] == (2, 7.0, 14.0, 22.0, 4.0)
    # An hour inside one session: its slots for that hour.
    one = sa.ok("GET", "/usage", params={"start": "2024-11-10T11:00:00Z",
                                         "end": "2024-11-10T12:00:00Z"})
    assert _rows(one) == {"ann": (1, 1.0, 2.0, 2.0, 0.0)}


def test_each_sees_their_own_scope(world):
    # A user: their own sessions only; a domain admin: their domain (not carl's).
    assert _rows(_usage(world["bob"]["client"])) == {"bob": (1, 1.0, 0.5, 2.0, 0.0)}
    assert set(_rows(_usage(world["admin"]["client"]))) == {"ann", "bob"}
    assert _rows(_usage(world["other"]["client"], group_by="domain")) == {
        "labb": (1, 10.0, 10.0, 10.0, 0.0)}


@pytest.mark.parametrize("q, words", [
    ({"start": "yesterday"}, "start: 'yesterday' is not a date or time"),
    ({"start": "2024-11-02", "end": "2024-11-01"}, "must be after start"),
    ({"group_by": "planet"}, "group_by"),
    ({"start": "2000-01-01", "end": "2024-01-01"}, "at most ten years"),
])
def test_bad_periods_are_refused_in_words(world, q, words):
    r = world["sa"]("GET", "/usage", params=q)
    assert r.status_code == 400, r.text
    assert words in r.json()["detail"]


def test_a_real_session_counts_and_the_figures_survive_a_restart(world):
    hub, ann = world["hub"], world["ann"]
    r = hub.spawn("ann", "counted", {"cpu": "0.5", "mem": "256m"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("ann", "counted")
    hub.stop_server("ann", "counted")
    now = dt.datetime.now(UTC)
    q = {"start": (now - dt.timedelta(hours=1)).isoformat(),
         "end": (now + dt.timedelta(minutes=1)).isoformat()}
    before = ann["client"].ok("GET", "/usage", params=q)
    (row,) = before["items"]
    assert row["name"] == "ann" and row["sessions"] == 1 and row["hours"] > 0
    assert row["cpu_hours"] == pytest.approx(0.5 * row["hours"], rel=1e-3, abs=1e-4)
    assert row["mem_gib_hours"] == pytest.approx(0.25 * row["hours"], rel=1e-3, abs=1e-4)
    hub.stop_hub()
    hub.start()
    assert ann["client"].ok("GET", "/usage", params=q) == before


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def test_console_usage_table_and_csv(world, browser):
    hub = world["hub"]
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("console", lambda m: console_error(m) and errors.append(m.text))
    try:
        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", ADMIN_EMAIL)
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url("**/hub/**")
        page.goto(hub.base + "/hub/backendai/admin/usage")
        page.fill("#usage-start", "2024-11-01")
        page.fill("#usage-end", "2024-12-01")
        page.select_option("#usage-group-by", "project")
        with page.expect_navigation():
            page.click("#backendai-usage-form [type=submit]")
        cells = page.locator('#backendai-usage tr[data-key] td').all_inner_texts()
        assert cells[:6] == ["(no project)", "3", "14", "16.5", "18", "0"], cells
        assert page.locator("#backendai-usage tfoot").inner_text().split() == [
            "Total", "4", "16", "20.5", "26", "2", "0", "0", "0", "0"]
        screenshot(page, "usage-console.png", full_page=True)
        with page.expect_download() as dl:
            page.click("#backendai-usage-csv")
        text = open(dl.value.path(), encoding="utf-8").read()
        rows = list(csv.reader(io.StringIO(text)))
        assert rows[0] == ["project", "key", "sessions", "hours", "cpu_hours",
                           "mem_gib_hours", "gpu_hours", "sampled_hours", "used_cpu_hours",
                           "used_mem_gib_hours", "used_gpu_hours"]
        assert ["default/vision", world["proj"]["id"], "1", "2.0", "4.0", "8.0", "2.0",
                "0.0", "0.0", "0.0", "0.0"] in rows
        # A bad date: the reason where it happened, no table.
        page.fill("#usage-start", "soon")
        with page.expect_navigation():
            page.click("#backendai-usage-form [type=submit]")
        assert "start: 'soon' is not a date or time" in page.locator(
            "#backendai-usage-error").inner_text()
        assert page.locator("#backendai-usage").count() == 0
        assert errors == [] or all("400" in e for e in errors), errors
    finally:
        ctx.close()
    # (users get the console's 403; their own figures come from the API, above)
    r = hub.login(world["bob"]["email"], PASSWORD).get(hub.base + "/hub/backendai/admin/usage")
    assert r.status_code == 403
