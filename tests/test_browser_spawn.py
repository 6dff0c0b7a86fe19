"""The spawn path as a person sees it, in headless Chromium on the Docker backend.

The form at /hub/spawn/<user>/<name> in human units (cores, GiB), with no GPU field in a
group without GPUs; a bad memory size refused in plain words (no regex, no "HTTP 400");
a good one accepted, the progress page showing every state of the session, JupyterLab
loading. Then a second server, pending on the keypair's quota past the hub's
start_timeout, ends on the failure page with the quota's reason. Screenshots of the
form, progress and failure pages go to $BACKENDAI_TEST_ARTIFACTS (default
test-artifacts/ in the checkout).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Keypair, KeypairResourcePolicy, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .chromium import chromium, console_error, screenshot
from .conftest import containers_of
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

pytestmark = [pytest.mark.browser, pytest.mark.docker]

# The whole hub's start_timeout: the good server must start within it, the quota-pending
# one fails when it runs out (a little before, with its reason: Spawner._start_budget).
# 60 s: with two suites on the 2 cores (load 19, stop 33's pair) the good server's
# container was still being created at 30 s in both suites.
START_TIMEOUT = 60
QUOTA_REASON = ("pending: quota exceeded: your keypair's resource policy allows 0.5 cores in "
                "total; 0.5 cores are in use and this session asks for 0.5 more "
                "(keypair policy 'default', total_resource_slots)")
STATES = ["pending", "scheduled", "preparing", "creating", "running"]
REGEX_MARKS = ("^", "$", "(?", "\\d", "[0-9", ".*", "+)", "pattern")

# Records every progress event the page receives, across the page's reload into Lab
# (sessionStorage lives as long as the tab): the page's own handler fills
# #progress-log from the same events, but the last ones are gone once it navigates.
RECORD_PROGRESS = """
(() => {
  const Native = window.EventSource;
  if (!Native || Native.__recorded) return;
  function Recorded(url, opts) {
    const es = new Native(url, opts);
    es.addEventListener("message", (e) => {
      const log = JSON.parse(sessionStorage.getItem("bai-progress") || "[]");
      log.push(JSON.parse(e.data));
      sessionStorage.setItem("bai-progress", JSON.stringify(log));
    });
    return es;
  }
  Recorded.prototype = Native.prototype;
  Recorded.__recorded = true;
  window.EventSource = Recorded;
})();
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory, docker_image):
    """One Docker hub for the module: 2 cores and 4 GiB, no GPU, a short start timeout,
    and the admin's keypair limited to 0.5 cores in total (one server of 0.5 cores
    fits; a second one waits PENDING on the quota)."""
    d = tmp_path_factory.mktemp("browser-spawn")
    h = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="docker",
            slots={"cpu": 2, "mem": "4g"},
            extra_env={"BACKENDAI_START_TIMEOUT": str(START_TIMEOUT)},
            # The POST goes to the progress page at once, however fast the start.
            extra_args=["--JupyterHub.slow_spawn_timeout=0"]).start()
    engine = make_engine(h.db_url)
    h.sm = make_sessionmaker(engine)
    with h.sm.begin() as s:
        kp = s.scalar(select(Keypair).where(Keypair.is_active.is_(True)))
        s.get(KeypairResourcePolicy, kp.resource_policy).total_resource_slots = ResourceSlot(cpu="0.5")
    # The API token first: once a server runs, a fresh requests login also collects the
    # single-user server's _xsrf cookie (see test_browser).
    assert h.admin_token
    yield h
    try:
        for u in h.api("GET", "/users").json():
            for name in list(u.get("servers", {})):
                h.stop_server(u["name"], name)
    finally:
        h.close()
        engine.dispose()
        left = containers_of(h.agent_id)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        shutil.rmtree(h.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


class _Page:
    """A logged-in tab that keeps every console error with the page it came from."""

    def __init__(self, hub, browser):
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.context.set_default_timeout(30_000)
        self.context.add_init_script(RECORD_PROGRESS)
        self.page = self.context.new_page()
        self.errors: list[tuple[str, str]] = []
        self.page.on("console", lambda m: console_error(m) and self.errors.append(
            (self.page.url, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append((self.page.url, f"uncaught: {e}")))
        self.page.goto(hub.base + "/hub/login")
        self.page.fill("input[name=username]", ADMIN_EMAIL)
        self.page.fill("input[name=password]", ADMIN_PASSWORD)
        self.page.click("#login_submit")
        self.page.wait_for_url(re.compile(r"/hub/(spawn|home)"))

    def ours(self) -> list[tuple[str, str]]:
        """Console errors on the hub's pages (not JupyterLab's, which is not ours)."""
        return [(u, t) for u, t in self.errors if "/hub/" in u]

    def shot(self, name: str) -> None:
        screenshot(self.page, f"spawn-{name}.png", full_page=True)

    def close(self) -> None:
        self.context.close()


def _fill(hub, page, cpu: str, mem: str) -> None:
    page.select_option("#backendai-image", hub.image)
    page.fill("#backendai-cpu", cpu)
    page.fill("#backendai-mem", mem)
    page.locator("#spawn_form [type=submit]").click()


def _sessions_not_ended(hub, name: str) -> int:
    with hub.sm() as s:
        return s.scalar(select(func.count()).select_from(Session).where(
            Session.name == name, Session.status.notin_(["TERMINATED", "CANCELLED", "ERROR"])))


def test_form_in_human_units_bad_memory_refused_then_lab(hub, browser):
    tab = _Page(hub, browser)
    page = tab.page
    try:
        # -- the form ------------------------------------------------------------------
        page.goto(hub.base + "/hub/spawn/admin/work")
        page.locator("#spawn_form").wait_for()
        assert page.locator("#backendai-free").inner_text().strip() == (
            "Free on the largest agent now: 2 cores, 4 GiB memory")
        assert page.locator("label[for=backendai-cpu]").inner_text().strip() == "CPU cores"
        assert page.locator("#backendai-mem-help").inner_text().strip() == "A size like 512m, 2g or 1.5 GiB"
        assert page.locator("[name=gpu]").count() == 0  # the group has no GPU slots
        assert page.locator("#spawn_form [pattern]").count() == 0  # no regex to quote back
        assert page.locator("#backendai-unisolated").count() == 0  # Docker: isolated
        # The keypair's quota (0.5 cores in total) bounds the field in the page.
        assert page.get_attribute("#backendai-cpu", "max") == "0.5"
        assert page.locator("#backendai-quota").inner_text().strip().startswith(
            "Your quota: 0.5 cores left")
        tab.shot("form")

        # -- a bad memory size: plain words, nothing started ---------------------------------
        _fill(hub, page, "0.25", "lots")
        error = page.locator(".spawn-error-msg")
        error.wait_for()
        text = error.inner_text().strip()
        assert text == "Error: mem must be a size like 512m, 2g or 1.5 GiB, not 'lots'", text
        assert "HTTP 400" not in text and not any(m in text for m in REGEX_MARKS), text
        # JupyterHub's form posts to its own URL with ?_xsrf=...; the page answers in place.
        assert urlsplit(page.url).path == "/hub/spawn/admin/work", page.url
        # The form again, with what the user entered (not the defaults).
        assert page.input_value("#backendai-image") == hub.image
        assert page.input_value("#backendai-cpu") == "0.25"
        assert page.input_value("#backendai-mem") == "lots"
        tab.shot("form-error")
        assert hub.server_model("admin", "work") is None
        assert _sessions_not_ended(hub, "work") == 0
        # Chromium logs the refused POST's 400 as a console error: the one error expected.
        assert [e for e in tab.ours() if urlsplit(e[0]).path != "/hub/spawn/admin/work"] == [], tab.errors
        assert [t for u, t in tab.ours()] == [
            "Failed to load resource: the server responded with a status of 400 (Bad Request)"], tab.errors
        tab.errors.clear()

        # -- a good one: every state on the progress page, then JupyterLab ---------------------
        builds: list[str] = []
        page.on("request", lambda r: "/lab/api/build" in r.url and builds.append(r.url))
        _fill(hub, page, "0.5", "1.5 GiB")
        page.wait_for_url(re.compile(r"/user/admin/work/lab"), timeout=(START_TIMEOUT + 30) * 1000,
                          wait_until="commit")
        page.locator("#jp-main-dock-panel").wait_for(timeout=60_000)
        # The image's JupyterLab cannot be rebuilt by its user: no build check (a
        # `node` run in the kernel at each first load), no Build menu.
        config = page.evaluate("JSON.parse(document.getElementById('jupyter-config-data').textContent)")
        assert (config["buildCheck"], config["buildAvailable"]) == (False, False), config
        assert builds == [], builds
        events = page.evaluate("JSON.parse(sessionStorage.getItem('bai-progress') || '[]')")
        messages = [e.get("message", "") for e in events]
        print("progress messages:", messages)
        assert messages[0] == "Server requested", messages
        assert events[-1].get("ready"), messages
        states = [m.split(":")[0] for m in messages if m.split(":")[0] in STATES + ["pulling"]]
        assert states == STATES, messages  # each once, in order (the image is present: no pulling)
        assert not any(m.startswith("running: running") for m in messages), messages
        assert tab.ours() == [], tab.errors
        print("console errors outside the hub's pages (JupyterLab):", tab.errors)
        with hub.sm() as s:
            sess = s.scalar(select(Session).where(Session.name == "work", Session.status == "RUNNING"))
            assert sess.requested_slots["mem"] == 3 * 2**29  # 1.5 GiB
        assert len(containers_of(hub.agent_id)) == 1
    finally:
        tab.close()


def test_quota_pending_past_start_timeout_shows_the_reason(hub, browser):
    """The admin's keypair may use 0.5 cores in total; "work" holds them, so "quota"
    waits PENDING until the start timeout, and fails with the quota reason."""
    if not (hub.server_model("admin", "work") or {}).get("ready"):
        assert hub.spawn("admin", "work", {"cpu": "0.5"}).status_code in (201, 202)
        hub.wait_ready("admin", "work")
    tab = _Page(hub, browser)
    page = tab.page
    try:
        page.goto(hub.base + "/hub/spawn/admin/quota")
        page.locator("#spawn_form").wait_for()
        _fill(hub, page, "0.5", "512m")
        page.wait_for_url(re.compile(r"/hub/spawn-pending/admin/quota"))
        message = page.locator("#progress-message")
        # The pending reason, live, while the session waits.
        page.wait_for_function(
            "(r) => document.querySelector('#progress-message')?.textContent.startsWith(r)",
            arg=QUOTA_REASON)
        page.locator("#progress-details summary").click()  # open the event log, as a person would
        log = page.locator("#progress-log .progress-log-event").all_inner_texts()
        assert log[0] == "Server requested" and log[-1] == QUOTA_REASON, log
        assert [m.split(":")[0] for m in log[1:]] == ["pending"], log
        tab.shot("progress-pending-quota")

        # The failure, with the reason, when start_timeout runs out.
        page.locator("#progress-bar.bg-danger").wait_for(timeout=(START_TIMEOUT + 30) * 1000)
        failed = message.inner_text().strip()
        assert failed.startswith(
            f"Spawn failed: The server did not start within {START_TIMEOUT} s; its session is still "
            + QUOTA_REASON), failed
        assert "HTTP" not in failed and "SpawnException" not in failed, failed
        assert page.locator("#progress-details").get_attribute("open") is not None
        tab.shot("progress-failed")
        assert tab.ours() == [], tab.errors

        # A later visit: JupyterHub's own failure page, with the same reason.
        tab.errors.clear()
        response = page.goto(hub.base + "/hub/spawn-pending/admin/quota")
        # JupyterHub serves its failure page with the failed start's status (a 500 for a
        # start that did not finish; jupyterhub/handlers/pages.py SpawnPendingHandler),
        # and Chromium logs any document's 5xx as a console error: the one error expected.
        assert response.status == 500
        page.locator("h1", has_text="Spawn failed").wait_for()
        body = re.sub(r"\s+", " ", page.locator("body").inner_text())
        assert "The latest attempt to start your server quota has failed." in body, body
        assert (f"The server did not start within {START_TIMEOUT} s; its session is still "
                + QUOTA_REASON) in body, body
        assert "SpawnException" not in body and "HTTP 500" not in body, body
        tab.shot("failure-page")
        assert tab.ours() == [(page.url, "Failed to load resource: the server responded with a status "
                                         "of 500 (Internal Server Error)")], tab.errors

        # Nothing of it is left: its session ended (the hub stops a failed start just
        # after reporting it), "work" is the only container.
        deadline = time.monotonic() + 30
        while _sessions_not_ended(hub, "quota") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sessions_not_ended(hub, "quota") == 0
        assert len(containers_of(hub.agent_id)) == 1
    finally:
        tab.close()
