"""A person's path through the UI, in headless Chromium (Playwright).

login -> the spawn form (our fields inside JupyterHub's page, a vfolder ticked) -> the
progress page with our session states -> JupyterLab -> a terminal in the kernel container,
which reads and writes the vfolder -> stop -> no container left.
Docker backend, one SQLite run.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from .chromium import chromium
from .conftest import containers_of
from .hub import ADMIN_EMAIL, ADMIN_PASSWORD
from .test_mounts import make_hub_folder

pytestmark = [pytest.mark.browser, pytest.mark.docker]

# Our session states as the spawner's progress() words them (lower case).
STATE_WORDS = re.compile(r"\b(pending|scheduled|preparing|pulling|creating|running)\b")


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def _terminal_text(page) -> str:
    """What the visible terminal shows: xterm's DOM rows, else its screen-reader mirror."""
    return page.evaluate(
        """() => {
            const term = [...document.querySelectorAll('.jp-Terminal')]
                .find(t => !t.closest('.lm-mod-hidden'));
            if (!term) return '';
            const rows = term.querySelector('.xterm-rows');
            const a11y = term.querySelector('.xterm-accessibility-tree');
            return [rows ? rows.innerText : '', a11y ? a11y.innerText : ''].join('\\n');
        }"""
    )


def _wait_terminal_text(page, pattern: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = _terminal_text(page)
        if re.search(pattern, text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"terminal never showed {pattern!r}; it shows:\n{text}")


def test_login_spawn_terminal_stop(make_hub, docker_image, browser, tmp_path):
    hub = make_hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="docker")
    folder_id, folder = make_hub_folder(hub, "admin", "notes")
    with open(os.path.join(folder, "hello.txt"), "w") as f:
        f.write("from-the-vfolder\n")
    # The API token first: once the server runs, a fresh requests login also collects the
    # single-user server's _xsrf cookie and Hub.token_for's cookies.get("_xsrf") turns ambiguous.
    assert hub.admin_token
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    page = context.new_page()
    progress_messages: list[str] = []
    try:
        # -- login ----------------------------------------------------------------
        page.goto(hub.base + "/hub/login")
        page.fill("input[name=username]", ADMIN_EMAIL)
        page.fill("input[name=password]", ADMIN_PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/hub/spawn"))

        # -- the spawn form: ours, inside JupyterHub's page -------------------------
        form = page.locator("#spawn_form")
        form.wait_for()
        options = page.locator("#backendai-image option").all_text_contents()
        assert hub.image in options, options
        page.select_option("#backendai-image", hub.image)
        page.fill("#backendai-cpu", "0.5")
        page.fill("#backendai-mem", "512m")
        box = page.locator(f"#backendai-mount-{folder_id}")
        label = page.locator(f"label[for=backendai-mount-{folder_id}]")
        assert re.sub(r"\s+", " ", label.inner_text()).strip() == "notes (admin, read-write)"
        box.check()
        form.locator("[type=submit]").click()

        # -- the progress page: our session states in the log ----------------------
        page.wait_for_url(re.compile(r"/hub/spawn-pending/|/user/admin/"))
        if "/spawn-pending/" in page.url:
            # Collect every message the page's event stream shows until it leaves.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "/spawn-pending/" in page.url:
                try:
                    progress_messages = page.locator(
                        "#progress-log .progress-log-event"
                    ).all_text_contents()
                except Exception:  # the page navigated away while we read it
                    break
                time.sleep(0.05)

        # -- JupyterLab ---------------------------------------------------------------
        page.wait_for_url(re.compile(r"/user/admin/lab"), timeout=60_000, wait_until="commit")
        page.locator("#jp-main-dock-panel").wait_for(timeout=60_000)
        # The page subscribes about a second after the POST, and progress() starts from the
        # session's state at that moment, so the earliest states may be past by then.
        print("progress messages:", progress_messages)
        assert any(STATE_WORDS.search(m.lower()) for m in progress_messages), progress_messages

        # xterm draws on a canvas; its screen-reader mode mirrors the screen into the DOM,
        # which is what lets the test read it. A user setting, set through Lab's settings API.
        status = page.evaluate(
            """async () => {
                const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
                const r = await fetch('/user/admin/lab/api/settings/@jupyterlab/terminal-extension:plugin', {
                    method: 'PUT',
                    headers: {'Content-Type': 'application/json', 'X-XSRFToken': decodeURIComponent(xsrf)},
                    body: JSON.stringify({raw: '{"screenReaderMode": true}'}),
                });
                return r.status;
            }"""
        )
        assert status == 204, status
        page.reload()
        page.locator("#jp-main-dock-panel").wait_for(timeout=60_000)

        # -- a terminal in the kernel container -----------------------------------------
        tile = page.locator(".jp-LauncherCard[data-category='Other'][title*='terminal' i]")
        tile.first.click(timeout=60_000)
        term = page.locator(".jp-Terminal .xterm").first
        term.wait_for()
        _wait_terminal_text(page, r"\$\s*$|\$ ", timeout=20)  # the prompt
        term.click()
        page.keyboard.type("echo hello-$((6*7))")
        page.keyboard.press("Enter")
        _wait_terminal_text(page, r"(?m)^hello-42\s*$")
        page.keyboard.type("whoami")
        page.keyboard.press("Enter")
        _wait_terminal_text(page, r"(?m)^work\s*$")
        # The ticked vfolder, at /home/work/notes: read what is there, write back.
        page.keyboard.type("cat /home/work/notes/hello.txt; echo from-$((6*7)) > /home/work/notes/back.txt; echo done")
        page.keyboard.press("Enter")
        _wait_terminal_text(page, r"(?m)^from-the-vfolder\s*$")
        _wait_terminal_text(page, r"(?m)^done\s*$")
    except BaseException:
        try:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            print(f"screenshot: {tmp_path / 'failure.png'}; url {page.url}")
            print("progress messages:", progress_messages)
        except Exception:
            pass
        raise
    finally:
        context.close()

    # -- the terminal's file is on the volume; stop, through the hub: nothing left behind ---
    with open(os.path.join(folder, "back.txt")) as f:
        assert f.read() == "from-42\n"
    assert len(containers_of(hub.agent_id)) == 1
    hub.stop_server("admin", "")
    assert containers_of(hub.agent_id) == []
