"""The pages under /hub/backendai/ in headless Chromium against a real hub: a user makes a
folder, uploads a file with the progress bar and downloads it; a domain admin creates a
user, sets a project quota and reads the queue; every page loads without console errors.
Screenshots of each page go to $BACKENDAI_TEST_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil

import pytest

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, superadmin
from .hub import REPO, Hub
from .test_pages import SECTIONS, USER_PAGES, _park, _user

sync_api = pytest.importorskip("playwright.sync_api")
ARTIFACTS = os.environ.get("BACKENDAI_TEST_ARTIFACTS", os.path.join(REPO, "test-artifacts"))
UPLOAD_MIB = 100


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser-pages")
    url = f"sqlite:///{d}/backendai.sqlite"
    hub = Hub(db_url=url, backend="local").start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        proj = sa.ok("POST", "/projects", json={"name": "teamproj", "domain_name": "default"})
        sa.ok("POST", "/resource-groups", json={"name": "parked", "is_public": True})
        w = {"hub": hub, "proj": proj, "dir": d}
        w["user"] = _user(sa, "webuser", "user", "default", [proj["id"]])
        w["dadmin"] = _user(sa, "webdadmin", "admin", "default")
        _park(hub, w["user"], "waitingsession")
        yield w
    finally:
        hub.close()
        hub.engine.dispose()
        shutil.rmtree(hub.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    from .test_browser import CHROMIUM, CHROMIUM_ARGS

    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A logged-in browser tab that records console errors."""

    def __init__(self, browser, hub: Hub, email: str, password: str = PASSWORD):
        self.hub = hub
        self.ctx = browser.new_context(accept_downloads=True)
        self.page = self.ctx.new_page()
        self.page.set_default_timeout(60_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(hub.base + "/hub/login")
        self.page.fill("input[name=username]", email)
        self.page.fill("input[name=password]", password)
        self.page.click("#login_submit")
        self.page.wait_for_url(re.compile(r"/hub/(spawn|home)"))

    def goto(self, path: str):
        r = self.page.goto(self.hub.base + "/hub/backendai/" + path)
        assert r.status == 200, (path, r.status)
        return r

    def shot(self, name: str) -> None:
        self.page.screenshot(path=os.path.join(ARTIFACTS, f"pages-{name}.png"), full_page=True)

    def close(self):
        self.ctx.close()


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
        page.click("#backendai-upload [type=submit]")
        box = page.locator("#backendai-upload-progress")
        page.wait_for_function(
            "document.getElementById('backendai-upload-progress').getAttribute('aria-valuenow') === '100'")
        # The bar followed the browser's progress events up to the whole file.
        assert int(box.get_attribute("data-updates")) >= 1
        assert box.get_attribute("data-max") == "100"
        assert page.locator("#backendai-message").inner_text() == "Uploaded big.bin."
        u.shot("folder-uploaded")
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

        page.fill("#backendai-share-email", world["dadmin"]["email"])
        page.select_option("#backendai-share-permission", "ro")
        page.click("#backendai-share [type=submit]")
        page.wait_for_function("document.getElementById('backendai-shares').textContent"
                               f".includes('{world['dadmin']['email']} (ro)')")
        page.fill("#backendai-rename-name", "renamedfolder")
        page.click("#backendai-rename [type=submit]")
        page.wait_for_function("document.querySelector('h1').textContent.trim() === "
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
        page.select_option("#u-projects", world["proj"]["id"])
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
        row.locator("button[type=submit]").click()
        page.wait_for_function(
            "document.querySelector('tr[data-name=\"teamproj\"] .backendai-quota')"
            ".textContent.trim() === '4 cores, 8 GiB memory'")
        a.shot("console-projects")
        got = world["hub"].api("GET", f"/backendai/projects/{pid}")
        assert got.json()["total_resource_slots"] == {"cpu": "4", "mem": str(8 * 2**30)}

        page.click("#backendai-console-queue")
        page.wait_for_url(re.compile(r"/admin/queue$"))
        parked = page.locator('section[data-resource-group="parked"]')
        assert parked.locator(".backendai-queue-summary").inner_text().startswith(
            "1 pending in your view (1 in the group)")
        waiting = parked.locator('tr[data-session-name="waitingsession"]')
        assert waiting.locator("td").nth(1).inner_text() == "webuser"
        assert waiting.locator(".backendai-reason").inner_text().strip() != ""
        a.shot("console-queue")
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
            assert p.errors == [], (who, p.errors)
        finally:
            p.close()
