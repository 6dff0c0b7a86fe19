"""The pages under /hub/backendai/ in headless Chromium against a real hub on the Docker
engine (the "Done means" of the web pages):

- a user starts a session from a preset that mounts a folder, follows the progress page
  into JupyterLab, writes a file into the folder from the page (Jupyter's contents API
  with the Lab page's own cookie and XSRF token), stops the session on "My sessions"
  and downloads the file from "My folders";
- a user makes a folder, uploads 100 MiB with the progress bar moving (values between 0
  and 100 seen) and downloads it;
- a domain admin creates a user, sets a project quota, sees the user's running session
  and the queue in the console;
- a user gets 403 on every console page, a domain admin's pages show nothing of another
  domain, and every page loads without console errors.

Screenshots of each page go to $BACKENDAI_TEST_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import hashlib
import json
import re
import time

import pytest
from sqlalchemy import select

from jupyterhub_backendai.models import Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, superadmin
from .chromium import chromium, console_error, screenshot
from .conftest import containers_of, shutdown_hub
from .hub import KERNEL_IMAGE, Hub
from .test_browser_spawn import RECORD_PROGRESS
from .test_pages import SECTIONS, USER_PAGES, _park, _user

pytestmark = [pytest.mark.browser, pytest.mark.docker]
UPLOAD_MIB = 100
# One preset, the default: the kernel image with the user's folder "labdata" mounted.
PRESETS = [{"display_name": "Lab with data", "slug": "labdata", "default": True,
            "description": "A notebook with your data",
            "user_options": {"image": KERNEL_IMAGE, "cpu": "0.5", "mem": "512m",
                             "mounts": ["labdata"]}}]
# What the other domain has: none of it may appear on a page of the default domain's admin.
OTHER_DOMAIN = ("otherdom", "secretproj", "hiddenuser", "hiddensession")


@pytest.fixture(scope="module")
def world(tmp_path_factory, docker_image):
    d = tmp_path_factory.mktemp("browser-pages")
    url = f"sqlite:///{d}/backendai.sqlite"
    hub = Hub(db_url=url, backend="docker", slots={"cpu": 2, "mem": "4g"},
              extra_env={"BACKENDAI_START_TIMEOUT": "90"},
              # The POST goes to the progress page at once, however fast the start.
              extra_args=["--BackendAISpawner.presets=" + json.dumps(PRESETS),
                          "--JupyterHub.slow_spawn_timeout=0"]).start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        from jupyterhub_backendai.common.types import HOST_PERMISSIONS

        proj = sa.ok("POST", "/projects", json={"name": "teamproj", "domain_name": "default"})
        # A second project without a quota (the new user of the console test joins both).
        w_side = sa.ok("POST", "/projects", json={"name": "sideproj", "domain_name": "default"})
        sa.ok("POST", "/resource-groups", json={"name": "parked", "is_public": True})
        sa.ok("POST", "/domains", json={
            "name": "otherdom", "allowed_vfolder_hosts": {"local:volume1": list(HOST_PERMISSIONS)}})
        proj_b = sa.ok("POST", "/projects", json={"name": "secretproj", "domain_name": "otherdom"})
        w = {"hub": hub, "proj": proj, "side": w_side, "dir": d, "sa": sa}
        w["user"] = _user(sa, "webuser", "user", "default", [proj["id"]])
        w["dadmin"] = _user(sa, "webdadmin", "admin", "default")
        w["user_b"] = _user(sa, "hiddenuser", "user", "otherdom", [proj_b["id"]])
        w["user"]["client"].ok("POST", "/vfolders", json={"name": "labdata"})
        _park(hub, w["user"], "waitingsession")
        _park(hub, w["user_b"], "hiddensession")
        yield w
    finally:
        hub.engine.dispose()
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


class Page:
    """A logged-in browser tab that records console errors with the page they came from."""

    def __init__(self, browser, hub: Hub, email: str, password: str = PASSWORD):
        self.hub = hub
        self.ctx = browser.new_context(accept_downloads=True, viewport={"width": 1280, "height": 900})
        self.ctx.add_init_script(RECORD_PROGRESS)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(60_000)
        self.errors: list[tuple[str, str]] = []
        self.page.on("console", lambda m: console_error(m) and self.errors.append(
            (self.page.url, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append((self.page.url, f"uncaught: {e}")))
        self.page.goto(hub.base + "/hub/login")
        self.page.fill("input[name=username]", email)
        self.page.fill("input[name=password]", password)
        self.page.click("#login_submit")
        self.page.wait_for_url(re.compile(r"/hub/(spawn|home)"))

    def goto(self, path: str):
        r = self.page.goto(self.hub.base + "/hub/backendai/" + path)
        assert r.status == 200, (path, r.status)
        return r

    def ours(self) -> list[tuple[str, str]]:
        """Console errors on the hub's pages (not JupyterLab's, which is not ours)."""
        return [(u, t) for u, t in self.errors if "/hub/" in u]

    def shot(self, name: str) -> None:
        screenshot(self.page, f"pages-{name}.png", full_page=True)

    def close(self):
        self.ctx.close()


def _session_status(hub, name: str) -> str | None:
    with hub.sm() as s:
        return s.scalar(select(Session.status).where(Session.name == name)
                        .order_by(Session.created_at.desc()).limit(1))


def test_session_from_preset_lab_file_stop_download(world, browser, tmp_path):
    """A user starts "work" from the preset (which mounts "labdata"), watches the progress
    page into JupyterLab, writes labdata/fromlab.txt from the Lab page, a domain admin sees
    the running session in the console; the user stops it on "My sessions" and downloads
    the file from "My folders"."""
    hub = world["hub"]
    u = Page(browser, hub, world["user"]["email"])
    page = u.page
    try:
        page.goto(hub.base + "/hub/spawn/webuser/work")
        page.locator("#spawn_form").wait_for()
        assert page.locator("#backendai-preset-labdata").is_checked()
        help_text = page.locator("#backendai-preset-labdata-help").inner_text().strip()
        assert help_text == (f"A notebook with your data: {KERNEL_IMAGE}, 0.5 cores, 512 MiB memory; "
                             "folders: labdata"), help_text
        u.shot("spawn-form")
        page.locator("#spawn_form [type=submit]").click()
        page.wait_for_url(re.compile(r"/hub/spawn-pending/webuser/work"))
        page.locator("#progress-message").wait_for()
        u.shot("spawn-progress")
        page.wait_for_url(re.compile(r"/user/webuser/work/lab"), timeout=120_000, wait_until="commit")
        page.locator("#jp-main-dock-panel").wait_for(timeout=90_000)
        events = page.evaluate("JSON.parse(sessionStorage.getItem('bai-progress') || '[]')")
        messages = [e.get("message", "") for e in events]
        # The progress page showed the session's states up to running, then the server ready.
        assert messages and messages[0] == "Server requested", messages
        assert any(m.startswith("running") for m in messages), messages
        assert events[-1].get("ready"), messages
        u.shot("jupyterlab")

        # -- a file written into the mounted folder from the Lab page -------------------------
        status = page.evaluate(
            """async () => {
                const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
                const r = await fetch('/user/webuser/work/api/contents/labdata/fromlab.txt', {
                    method: 'PUT',
                    headers: {'Content-Type': 'application/json',
                              'X-XSRFToken': decodeURIComponent(xsrf)},
                    body: JSON.stringify({type: 'file', format: 'text',
                                          content: 'written in JupyterLab\\n'}),
                });
                return r.status;
            }""")
        assert status == 201, status
        # Lab's file browser shows it too (the folder is the mount at /home/work/labdata).
        listing = page.evaluate("""async () => {
            const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
            const r = await fetch('/user/webuser/work/api/contents/labdata?content=1',
                                  {headers: {'X-XSRFToken': decodeURIComponent(xsrf)}});
            return [r.status, await r.text()];
        }""")
        assert listing[0] == 200, listing
        assert [e["name"] for e in json.loads(listing[1])["content"]] == ["fromlab.txt"], listing

        # -- the domain admin's console: the running session, with its owner -------------------
        a = Page(browser, hub, world["dadmin"]["email"])
        try:
            a.goto("admin/sessions?status=RUNNING")
            row = a.page.locator('tr[data-session-name="work"]')
            cells = row.locator("td").all_inner_texts()
            assert cells[1:3] == ["webuser", "default"], cells
            assert row.locator(".backendai-status").inner_text() == "RUNNING"
            assert cells[5] == "0.5 cores, 512 MiB memory", cells
            assert row.locator(".backendai-stop").inner_text() == "Force-stop"
            a.shot("console-sessions-running")
            # The agent's live statistics: the running kernel's own memory use, by name
            # (sampled every heartbeat: reload until the sample after the start is in).
            deadline = time.monotonic() + 40
            while True:
                a.goto("admin/agents")
                live = a.page.locator('.backendai-live-kernels tr[data-session-name="work"]')
                if live.count() or time.monotonic() > deadline:
                    break
                time.sleep(2)
            cells = live.locator("td").all_inner_texts()
            assert cells[:2] == ["work", "webuser"], cells
            used, limit = cells[3].split(" of ")
            assert used not in ("0 B", "0 bytes") and limit == "512 MiB", cells
            assert "cores busy" in a.page.locator(".backendai-live").first.inner_text()
            a.shot("console-agents-live")
            assert a.errors == [], a.errors
        finally:
            a.close()

        # -- stop it on "My sessions" -----------------------------------------------------------
        u.goto("sessions")
        row = page.locator('tr[data-session-name="work"]')
        assert row.locator(".backendai-status").inner_text() == "RUNNING"
        assert row.locator("a", has_text="Open").get_attribute("href") == "/user/webuser/work/"
        # The image's apps (its service ports), each a link below the server; one opens.
        apps = row.locator(".backendai-apps a")
        assert {apps.nth(i).get_attribute("data-app"): apps.nth(i).get_attribute("href")
                for i in range(apps.count())} == {
            "jupyter": "/user/webuser/work/", "tensorboard": "/user/webuser/work/tensorboard/",
            "hello": "/user/webuser/work/hello/", "vscode": "/user/webuser/work/vscode/"}
        u.shot("sessions-running")
        with u.ctx.expect_page() as new:
            row.locator('.backendai-apps a[data-app="hello"]').click()
        app = new.value
        try:
            app.locator("#greeting").wait_for(timeout=90_000)
            assert app.url == hub.base + "/user/webuser/work/hello/", app.url
        finally:
            app.close()
        page.once("dialog", lambda d: d.accept())
        with page.expect_navigation():
            row.locator(".backendai-stop").click()
        deadline = time.monotonic() + 60
        while _session_status(hub, "work") != "TERMINATED" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _session_status(hub, "work") == "TERMINATED"
        assert containers_of(hub.agent_id) == []
        u.goto("sessions")
        assert row.locator(".backendai-status").inner_text() == "TERMINATED"
        assert row.locator(".backendai-stop").count() == 0
        u.shot("sessions-stopped")

        # -- the file, from "My folders" ------------------------------------------------------
        u.goto("folders")
        page.locator('tr[data-folder-name="labdata"] a').click()
        page.wait_for_url(re.compile(r"/hub/backendai/folders/[0-9a-f]+$"))
        file_row = page.locator('tr[data-file-name="fromlab.txt"]')
        with page.expect_download() as dl:
            file_row.locator(".backendai-download").click()
        saved = tmp_path / "fromlab.txt"
        dl.value.save_as(saved)
        assert dl.value.suggested_filename == "fromlab.txt"
        assert saved.read_text() == "written in JupyterLab\n"
        u.shot("folder-from-lab")
        assert u.ours() == [], u.errors
    except BaseException:
        u.shot("failure-session")
        print(hub.log()[-8000:])
        raise
    finally:
        u.close()


def test_user_folder_upload_with_progress_and_download(world, browser, tmp_path):
    u = Page(browser, world["hub"], world["user"]["email"])
    try:
        page = u.page
        page.goto(world["hub"].base + "/hub/home")
        page.click("#backendai-nav-folders")
        page.wait_for_url(re.compile(r"/hub/backendai/folders$"))
        page.fill("#backendai-folder-name", "browserfolder")
        page.click("#backendai-folder-create [type=submit]")
        page.wait_for_url(re.compile(r"/hub/backendai/folders/[0-9a-f]+$"))
        assert page.locator("h1").inner_text().strip() == "Folder browserfolder"
        assert page.locator("#backendai-empty-folder").inner_text() == "This folder is empty."

        data = tmp_path / "big.bin"
        with open(data, "wb") as f:
            for i in range(UPLOAD_MIB):
                f.write(hashlib.sha256(str(i).encode()).digest() * (2**20 // 32))
        digest = hashlib.sha256(data.read_bytes()).hexdigest()
        page.set_input_files("#backendai-upload-file", str(data))
        # The page's requests: the upload goes through the storage's tus endpoint.
        sent: list[tuple[str, str]] = []
        page.on("request", lambda r: sent.append((r.method, r.url)))
        # Every value the bar shows, as the page sets it (aria-valuenow), in order.
        page.evaluate("""() => {
            const box = document.getElementById('backendai-upload-progress');
            window.__seen = [];
            new MutationObserver(() => window.__seen.push(Number(box.getAttribute('aria-valuenow'))))
                .observe(box, {attributes: true, attributeFilter: ['aria-valuenow']});
        }""")
        page.click("#backendai-upload [type=submit]")
        # The bar reaches 100 when the browser has sent the last byte; the message comes
        # when the hub answered (the file stored), just before the page reloads.
        seen = page.wait_for_function("""() => {
            const m = document.getElementById('backendai-message');
            return m && m.textContent === 'Uploaded big.bin.' && window.__seen;
        }""").json_value()
        # tus: a token from request-upload, then 16 MiB PATCHes; no PUT through the API.
        patches = [u for m, u in sent if m == "PATCH" and "/storage/upload?token=" in u]
        assert len(patches) == -(-UPLOAD_MIB // 16), sent
        assert any(m == "POST" and u.endswith("/request-upload") for m, u in sent), sent
        assert not [u for m, u in sent if m == "PUT"], sent
        # The bar moved: values between 0 and 100 were shown on the way, never going back.
        assert [v for v in seen if 0 < v < 100], seen
        assert seen == sorted(seen) and seen[-1] == 100, seen
        row = page.locator('tr[data-file-name="big.bin"]')
        row.wait_for()
        assert row.locator("td").nth(1).inner_text() == f"{UPLOAD_MIB} MiB"
        u.shot("folder")

        with page.expect_download() as dl:
            row.locator(".backendai-download").click()
        saved = tmp_path / "downloaded.bin"
        dl.value.save_as(saved)
        assert dl.value.suggested_filename == "big.bin"
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == digest

        # A PATCH that fails (aborted in the browser): the page asks where the upload
        # stands (HEAD) and goes on from there; the file arrives whole.
        part = tmp_path / "resume.bin"
        part.write_bytes(data.read_bytes()[: 20 * 2**20])
        patched: list[str] = []

        def flaky(route):
            if route.request.method == "PATCH":
                patched.append(route.request.headers.get("upload-offset"))
                if len(patched) == 2:
                    return route.abort()
            return route.continue_()

        page.route("**/storage/upload?token=*", flaky)
        sent.clear()
        page.set_input_files("#backendai-upload-file", str(part))
        page.click("#backendai-upload [type=submit]")
        page.wait_for_function("""() => {
            const m = document.getElementById('backendai-message');
            return m && m.textContent === 'Uploaded resume.bin.';
        }""")
        page.unroute("**/storage/upload?token=*")
        assert patched == ["0", str(16 * 2**20), str(16 * 2**20)], patched
        assert any(m == "HEAD" and "/storage/upload?token=" in u for m, u in sent), sent
        row = page.locator('tr[data-file-name="resume.bin"]')
        row.wait_for()
        with page.expect_download() as dl:
            row.locator(".backendai-download").click()
        dl.value.save_as(tmp_path / "resume-down.bin")
        assert (tmp_path / "resume-down.bin").read_bytes() == part.read_bytes()
        # The aborted PATCH is the one network error the browser logs here.
        u.errors = [(w, t) for w, t in u.errors if "ERR_FAILED" not in t]

        page.fill("#backendai-share-email", world["dadmin"]["email"])
        page.select_option("#backendai-share-permission", "ro")
        page.click("#backendai-share [type=submit]")
        page.wait_for_function("document.getElementById('backendai-shares')?.textContent"
                               f".includes('{world['dadmin']['email']} (ro)')")
        page.fill("#backendai-rename-name", "renamedfolder")
        page.click("#backendai-rename [type=submit]")
        page.wait_for_function("document.querySelector('h1')?.textContent.trim() === "
                               "'Folder renamedfolder'")
        page.goto(world["hub"].base + "/hub/backendai/folders")
        assert page.locator('tr[data-folder-name="renamedfolder"] td').nth(1).inner_text() == "you"
        u.shot("folders")
        assert u.errors == [], u.errors
    finally:
        u.close()


def test_domain_admin_creates_user_sets_quota_and_sees_queue(world, browser):
    a = Page(browser, world["hub"], world["dadmin"]["email"])
    try:
        page = a.page
        page.goto(world["hub"].base + "/hub/home")
        page.click("#backendai-nav-console")
        page.wait_for_url(re.compile(r"/hub/backendai/admin/users$"))
        page.fill("#u-email", "newbie@example.com")
        page.fill("#u-username", "newbie")
        page.fill("#u-password", "newbie-pass-123")
        page.select_option("#u-projects", [world["proj"]["id"], world["side"]["id"]])
        page.click("#backendai-user-create [type=submit]")
        page.locator('tr[data-username="newbie"]').wait_for()
        cells = page.locator('tr[data-username="newbie"] td').all_inner_texts()
        assert cells[:5] == ["newbie", "newbie@example.com", "user", "default", "active"]
        a.shot("console-users")
        # The new user logs in with the password the admin gave.
        s = world["hub"].login("newbie@example.com", "newbie-pass-123")
        assert s.get(world["hub"].base + "/hub/home", allow_redirects=False).status_code == 200

        page.click("#backendai-console-projects")
        page.wait_for_url(re.compile(r"/admin/projects$"))
        row = page.locator('tr[data-name="teamproj"]')
        assert "newbie" in row.locator("td").nth(3).inner_text()
        pid = world["proj"]["id"]
        page.fill(f"#q-cpu-{pid}", "4")
        page.fill(f"#q-mem-{pid}", "8g")
        row.locator(".backendai-quota-form [type=submit]").click()
        page.wait_for_function(
            "document.querySelector('tr[data-name=\"teamproj\"] .backendai-quota')"
            "?.textContent.trim() === '4 cores, 8 GiB memory'")  # (re-rendered: null a moment)
        a.shot("console-projects")
        got = world["hub"].api("GET", f"/backendai/projects/{pid}")
        assert got.json()["total_resource_slots"] == {"cpu": "4", "mem": str(8 * 2**30)}

        # The new user's spawn form: the CPU field's bound follows the project chosen
        # (teamproj's new quota of 4 cores; sideproj has none).
        n = Page(browser, world["hub"], "newbie@example.com", "newbie-pass-123")
        try:
            n.page.goto(world["hub"].base + "/hub/spawn/newbie/bounds")
            n.page.locator("#spawn_form").wait_for()
            n.page.locator("#backendai-preset-custom").check()
            n.page.select_option("#backendai-project", "teamproj")
            assert n.page.get_attribute("#backendai-cpu", "max") == "4"
            assert n.page.locator("#backendai-quota").inner_text().startswith("Your quota: 4 cores")
            n.page.select_option("#backendai-project", "sideproj")
            assert n.page.get_attribute("#backendai-cpu", "max") is None
            n.page.select_option("#backendai-project", "teamproj")
            assert n.page.get_attribute("#backendai-cpu", "max") == "4"
            n.shot("spawn-form-project-bounds")
            assert n.ours() == [], n.errors
        finally:
            n.close()

        page.click("#backendai-console-queue")
        page.wait_for_url(re.compile(r"/admin/queue$"))
        parked = page.locator('section[data-resource-group="parked"]')
        assert parked.locator(".backendai-queue-summary").inner_text().startswith(
            "1 pending in your view (2 in the group)")
        waiting = parked.locator('tr[data-session-name="waitingsession"]')
        assert waiting.locator("td").nth(1).inner_text() == "webuser"
        assert waiting.locator(".backendai-reason").inner_text().strip() != ""
        a.shot("console-queue")
        assert a.errors == [], a.errors
    finally:
        a.close()


def test_domain_admin_edits_and_deletes_in_the_console(world, browser):
    """An edit (a user's role and name), a refused edit (a rate limit in words), a
    delete (the user), each through the console's own controls."""
    sa, hub = world["sa"], world["hub"]
    target = sa.ok("POST", "/users", json={"email": "editme@example.com", "password": PASSWORD,
                                           "username": "editme", "domain_name": "default"})
    ak = target["keypair"]["access_key"]
    rate = sa.ok("GET", f"/keypairs/{ak}")["rate_limit"]
    a = Page(browser, hub, world["dadmin"]["email"])
    try:
        page = a.page
        a.goto("admin/users")
        row = page.locator('tr[data-username="editme"]')
        page.click("#edit-user-editme-open")
        page.fill("#user-editme-full-name", "Edited Person")
        page.select_option("#user-editme-role", "monitor")
        a.shot("console-user-edit")
        with page.expect_navigation():
            page.locator("#edit-user-editme [type=submit]").click()
        assert row.locator("td").nth(2).inner_text() == "monitor"
        got = sa.ok("GET", f"/users/{target['id']}")
        assert (got["role"], got["full_name"], got["status"]) == ("monitor", "Edited Person", "active")

        # Bad input: the API's words on the page, nothing changed.
        a.goto("admin/keypairs")
        page.click(f"#edit-keypair-{ak}-open")
        page.fill(f"#keypair-{ak}-rate-limit", "lots")
        page.locator(f"#edit-keypair-{ak} [type=submit]").click()
        message = page.locator("#backendai-message")
        message.wait_for()
        assert message.inner_text() == (f"Could not change keypair {ak}: rate_limit: must be a "
                                         "whole number")
        a.shot("console-bad-input")
        assert sa.ok("GET", f"/keypairs/{ak}")["rate_limit"] == rate
        # Chromium logs the refused call as a console error: that one, and no other.
        assert [t for _u, t in a.errors] == [
            "Failed to load resource: the server responded with a status of 400 (Bad Request)"], a.errors
        a.errors.clear()

        a.goto("admin/users")
        page.once("dialog", lambda d: d.accept())
        with page.expect_navigation():
            row.locator(".backendai-delete").click()
        assert page.locator('tr[data-username="editme"]').count() == 0
        assert sa("GET", f"/users/{target['id']}").status_code == 404
        a.shot("console-user-deleted")
        assert a.errors == [], a.errors
    finally:
        a.close()


def test_every_page_loads_without_console_errors(world, browser):
    for who, pages in (("user", USER_PAGES), ("dadmin", USER_PAGES + [f"admin/{s}" for s in SECTIONS])):
        p = Page(browser, world["hub"], world[who]["email"])
        try:
            for path in pages:
                p.goto(path)
                assert p.page.locator("#backendai-nav-sessions").is_visible()
                p.shot(f"{who}-{path.replace('/', '-')}")
                if who == "dadmin":  # nothing of the other domain, on any page
                    html = p.page.content()
                    for secret in OTHER_DOMAIN + (world["user_b"]["keypair"]["access_key"],):
                        assert secret not in html, (path, secret)
            if who == "user":
                p.goto("sessions")
                sid = p.page.locator('tr[data-session-name="waitingsession"]').get_attribute(
                    "data-session-id")
                p.goto(f"sessions/{sid}/logs")
                p.shot("user-session-logs")
                p.goto("keys")
                p.page.click("#backendai-create-key")
                p.page.locator("#backendai-new-key").wait_for()
                secret = p.page.locator("#backendai-new-secret-key").inner_text()
                assert len(secret) >= 20
                p.shot("user-keys-created")
                p.page.reload()
                assert secret not in p.page.content()  # shown once, never again
                # Stop a session from "My sessions" (the browser asks first).
                p.goto("sessions")
                p.page.once("dialog", lambda d: d.accept())
                row = p.page.locator('tr[data-session-name="waitingsession"]')
                with p.page.expect_navigation():
                    row.locator(".backendai-stop").click()
                assert row.locator(".backendai-status").inner_text() == "CANCELLED"
                assert row.locator(".backendai-stop").count() == 0
                p.shot("user-sessions-stopped")
                # Every console page: 403 with the reason, in JupyterHub's error page.
                for section in SECTIONS:
                    r = p.page.goto(world["hub"].base + f"/hub/backendai/admin/{section}")
                    assert r.status == 403, (section, r.status)
                    assert ("The admin console is for superadmins and domain admins; your role "
                            "is user.") in p.page.locator("body").inner_text()
                    p.shot(f"user-admin-{section}-403")
                # Chromium logs each refused page as a console error: those, and only those.
                refused = [(u, t) for u, t in p.errors if "/hub/backendai/admin/" in u]
                assert refused == [(world["hub"].base + f"/hub/backendai/admin/{s}",
                                    "Failed to load resource: the server responded with a status "
                                    "of 403 (Forbidden)") for s in SECTIONS], refused
                p.errors = [e for e in p.errors if e not in refused]
            assert p.errors == [], (who, p.errors)
        finally:
            p.close()
