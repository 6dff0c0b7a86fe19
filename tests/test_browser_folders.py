"""Issue 29 point 5, the folder explorer on "My folders", in headless Chromium against a
real hub (local backend, the embedded storage proxy):

- several files at once and dropped files, each with its own progress bar; the notice
  says "Uploaded" only once every file's last byte was acknowledged;
- a new directory, rename and move (bad input said where it happened, nothing changed),
  the trash (move, restore, delete for good), modification times and the folder's size;
- a user the folder is shared with read-only sees no control that changes it.

Screenshots go to $BACKENDAI_TEST_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import os

import pytest

from .api_world import PASSWORD, superadmin
from .chromium import chromium, logged_in, screenshot
from .conftest import shutdown_hub
from .hub import Hub
from .test_pages import _user

pytestmark = [pytest.mark.browser]
BIG = 20 * 2**20  # two tus PATCHes of 16 MiB: the bar has a value between 0 and 100


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser-folders")
    hub = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="local").start()
    try:
        sa = superadmin(hub)
        w = {"hub": hub, "sa": sa, "dir": d}
        w["user"] = _user(sa, "folderuser", "user", "default")
        w["reader"] = _user(sa, "folderreader", "user", "default")
        w["folder"] = w["user"]["client"].ok("POST", "/vfolders", json={"name": "explore"})
        w["user"]["client"].ok("POST", f"/vfolders/{w['folder']['id']}/shares",
                               json={"email": w["reader"]["email"], "permission": "ro"})
        yield w
    finally:
        shutdown_hub(hub)


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def _tab(browser, hub, email):
    return logged_in(browser, hub, email, PASSWORD, accept_dialogs=True, accept_downloads=True)


def _names(client, fid, path="") -> dict[str, dict]:
    items = client.ok("GET", f"/vfolders/{fid}/files", params={"path": path})["items"]
    return {e["name"]: e for e in items}


def _download(client, fid, path) -> bytes:
    r = client("GET", f"/vfolders/{fid}/download", params={"path": path})
    assert r.status_code == 200, r.text
    return r.content


def test_upload_many_and_dropped_files_with_per_file_progress(world, browser, tmp_path):
    hub, fid, client = world["hub"], world["folder"]["id"], world["user"]["client"]
    files = {"big.bin": os.urandom(BIG), "small1.txt": b"one\n", "small2.txt": b"two\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    ctx, page, errors = _tab(browser, hub, world["user"]["email"])
    try:
        page.goto(hub.base + f"/hub/backendai/folders/{fid}")
        page.set_input_files("#backendai-upload-file", [str(tmp_path / n) for n in files])
        # Each bar's values as the page sets them, and what every bar and file said at
        # the moment the notice first read "Uploaded".
        page.evaluate("""() => {
            window.__bars = {};
            window.__atNotice = null;
            const list = document.getElementById('backendai-upload-files');
            new MutationObserver(() => {
                list.querySelectorAll('li').forEach((li) => {
                    const box = li.querySelector('[role=progressbar]');
                    if (box.__seen) return;
                    box.__seen = true;
                    window.__bars[li.dataset.uploadName] = [];
                    new MutationObserver(() => window.__bars[li.dataset.uploadName].push(
                        Number(box.getAttribute('aria-valuenow'))))
                        .observe(box, {attributes: true, attributeFilter: ['aria-valuenow']});
                });
            }).observe(list, {childList: true});
            const msg = document.getElementById('backendai-message');
            new MutationObserver(() => {
                if (window.__atNotice === null && msg.textContent.startsWith('Uploaded')) {
                    window.__atNotice = Array.from(list.querySelectorAll('li')).map((li) => [
                        li.dataset.uploadName, li.dataset.state,
                        Number(li.querySelector('[role=progressbar]').getAttribute('aria-valuenow'))]);
                }
            }).observe(msg, {childList: true, characterData: true, subtree: true});
        }""")
        page.click("#backendai-upload [type=submit]")
        notice = page.wait_for_function("() => window.__atNotice").json_value()
        assert notice == [[n, "done", 100] for n in files], notice
        bars = page.evaluate("window.__bars")
        assert [v for v in bars["big.bin"] if 0 < v < 100], bars
        assert bars["big.bin"] == sorted(bars["big.bin"]) and bars["big.bin"][-1] == 100, bars
        assert page.locator("#backendai-message").inner_text() == \
            "Uploaded 3 files: big.bin, small1.txt, small2.txt."
        screenshot(page, "folder-upload-many.png", full_page=True)
        # After the reload: the files, their sizes, the folder's size; the bytes stored.
        page.locator('tr[data-file-name="small2.txt"]').wait_for()
        assert page.locator('tr[data-file-name="big.bin"] td').nth(1).inner_text() == "20 MiB"
        assert page.locator("#backendai-message").inner_text().startswith("Uploaded 3 files")
        for name, data in files.items():
            assert _download(client, fid, name) == data
        assert page.locator('tr[data-file-name="big.bin"] time.backendai-time').count() == 1

        # Dropped from the desktop: a drop event carrying files, onto the drop zone.
        page.evaluate("""() => {
            const dt = new DataTransfer();
            dt.items.add(new File(['dropped one\\n'], 'drop1.txt', {type: 'text/plain'}));
            dt.items.add(new File(['dropped two\\n'], 'drop2.txt', {type: 'text/plain'}));
            const zone = document.getElementById('backendai-dropzone');
            zone.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));
            zone.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
        }""")
        page.locator('tr[data-file-name="drop2.txt"]').wait_for()
        assert _download(client, fid, "drop1.txt") == b"dropped one\n"
        assert _download(client, fid, "drop2.txt") == b"dropped two\n"
        page.wait_for_function("() => document.getElementById('backendai-folder-size')"
                               "?.textContent.includes('in 5 files')")
        screenshot(page, "folder-dropped.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()


def test_directories_moves_and_the_trash(world, browser):
    hub, fid, client = world["hub"], world["folder"]["id"], world["user"]["client"]
    client.ok("PUT", f"/vfolders/{fid}/upload", 201, params={"path": "keep.txt"}, data=b"keep")
    client.ok("PUT", f"/vfolders/{fid}/upload", 201, params={"path": "notes.txt"}, data=b"notes")
    ctx, page, errors = _tab(browser, hub, world["user"]["email"])
    try:
        page.goto(hub.base + f"/hub/backendai/folders/{fid}")
        name, err = page.get_by_label("New directory"), page.locator("#backendai-mkdir-error")
        before = _names(client, fid)
        for bad, said in (("", "Give a name."),
                          ("a/b", "A name cannot contain “/”: make one directory at a time."),
                          ("..", "“..” is not a name for a directory.")):
            name.fill(bad)
            name.press("Enter")
            err.wait_for(state="visible")
            assert err.inner_text() == said
            assert name.get_attribute("aria-invalid") == "true"
        assert _names(client, fid) == before  # nothing made
        name.fill("results")
        name.press("Enter")
        page.locator('tr[data-file-name="results"]').wait_for()
        assert page.locator("#backendai-message").inner_text() == "Made the directory results."
        assert _names(client, fid)["results"]["type"] == "dir"
        # The same name again: the storage's refusal, beside the field.
        page.get_by_label("New directory").fill("results")
        page.get_by_label("New directory").press("Enter")
        page.locator("#backendai-mkdir-error").wait_for(state="visible")
        assert "exists" in page.locator("#backendai-mkdir-error").inner_text()

        # Rename and move, in the row.
        row = page.locator('tr[data-file-name="notes.txt"]')
        row.get_by_role("button", name="Rename or move notes.txt").click()
        to = row.get_by_label("New path of notes.txt")
        move_err = row.locator(".backendai-move-error")
        to.fill("notes.txt")
        to.press("Enter")
        assert move_err.inner_text() == "That is where it is already: nothing changed."
        to.fill("keep.txt")  # exists: refused by the storage, nothing replaced
        to.press("Enter")
        page.wait_for_function("el => el.textContent.includes('already exists')",
                               arg=move_err.element_handle())
        assert _download(client, fid, "keep.txt") == b"keep"
        assert "notes.txt" in _names(client, fid)
        to.fill("results/notes-2026.txt")
        to.press("Enter")
        page.wait_for_function("() => document.getElementById('backendai-message')?.textContent"
                               " === 'Moved notes.txt to results/notes-2026.txt.'")
        assert "notes.txt" not in _names(client, fid)
        assert _download(client, fid, "results/notes-2026.txt") == b"notes"
        screenshot(page, "folder-moved.png", full_page=True)

        # The trash: moved there, listed as where it came from, restored, deleted for good.
        page.locator('tr[data-file-name="keep.txt"]').get_by_role(
            "button", name="Move keep.txt to the trash").click()
        page.locator("#backendai-trash-link").wait_for()
        assert page.locator('tr[data-file-name="keep.txt"]').count() == 0
        assert page.locator("#backendai-trash-link").inner_text() == "Trash (1 item)"
        assert ".trash" not in [r.get_attribute("data-file-name") for r in
                                page.locator("tr[data-file-name]").all()]
        page.click("#backendai-trash-link")
        entry = page.locator("tr[data-file-name^='keep.txt~']")
        assert entry.locator("td").first.inner_text() == "keep.txt"
        screenshot(page, "folder-trash.png", full_page=True)
        entry.get_by_role("button", name="Restore keep.txt").click()
        page.wait_for_function("() => document.getElementById('backendai-message')?.textContent"
                               " === 'Restored keep.txt.'")
        assert page.locator("#backendai-empty-folder").inner_text() == "The trash is empty."
        assert _download(client, fid, "keep.txt") == b"keep"

        page.goto(hub.base + f"/hub/backendai/folders/{fid}?path=results")
        page.locator('tr[data-file-name="notes-2026.txt"]').get_by_role(
            "button", name="Move notes-2026.txt to the trash").click()
        page.wait_for_function("() => document.getElementById('backendai-message')?.textContent"
                               " === 'Moved results/notes-2026.txt to the trash.'")
        page.goto(hub.base + f"/hub/backendai/folders/{fid}?path=.trash")
        entry = page.locator("tr[data-file-name^='results%2Fnotes-2026.txt~']")
        assert entry.locator("td").first.inner_text() == "results/notes-2026.txt"
        entry.get_by_role("button", name="Delete results/notes-2026.txt for good").click()
        page.locator("#backendai-empty-folder").wait_for()
        assert _names(client, fid, ".trash") == {}
        assert "notes-2026.txt" not in _names(client, fid, "results")
        # The browser logs the refusals asked for (mkdir and move onto existing names).
        assert [e for e in errors if "status of 409" not in e] == [], errors
        assert len(errors) == 2, errors
    finally:
        ctx.close()


def test_a_read_only_reader_sees_no_control_that_changes_the_folder(world, browser):
    hub, fid = world["hub"], world["folder"]["id"]
    ctx, page, errors = _tab(browser, hub, world["reader"]["email"])
    try:
        page.goto(hub.base + f"/hub/backendai/folders/{fid}")
        page.locator('tr[data-file-name="keep.txt"]').wait_for()
        for gone in ("#backendai-upload", "#backendai-dropzone", "#backendai-mkdir",
                     ".backendai-move", ".backendai-trash", ".backendai-move-form"):
            assert page.locator(gone).count() == 0, gone
        assert page.locator('tr[data-file-name="keep.txt"] .backendai-download').count() == 1
        screenshot(page, "folder-read-only.png", full_page=True)
        assert errors == []
    finally:
        ctx.close()
