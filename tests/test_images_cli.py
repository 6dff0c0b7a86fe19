"""Issue 25: Backend.AI's official CLI (23.09 and 26.09) on the image catalogue:
``admin image rescan`` of a real registry (tests/registry.py: auth, TLS), ``admin image
list``, ``alias``, ``dealias``; refusals in words for a plain user and an unknown
registry, nothing changed by them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid

import pytest

from jupyterhub_backendai.models import ContainerRegistry, Image, ImageAlias
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import new_user, superadmin
from .conftest import shutdown_hub
from .hub import Hub
from .registry import Registry, remove_images
from .services import image_tag
from .test_backendai_client import BAI, CLI, CLI26


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    """A registry holding ``lab/tiny:1`` (a labelled image ``FROM scratch``: one file)
    and ``lab/plain:1`` (no ``ai.backend.kernelspec``: not a kernel image)."""
    r = Registry().start()
    built = []
    try:
        d = tmp_path_factory.mktemp("tiny")
        (d / "hello").write_text("hello\n")
        for repo, labels in (("tiny", 'LABEL "ai.backend.kernelspec"="1" '
                                      '"ai.backend.resource.min.cpu"="0.5" '
                                      '"ai.backend.resource.min.mem"="64m"\n'),
                             ("plain", "")):
            (d / "Dockerfile").write_text(f"FROM scratch\nCOPY hello /hello\n{labels}")
            tag = image_tag(f"cli-{repo}")
            subprocess.run(["docker", "build", "-q", "-t", tag, str(d)], check=True,
                           capture_output=True)
            built.append(tag)
            r.push(tag, f"lab/{repo}", "1")
        remove_images(*built)
        built.clear()
        yield r
    finally:
        remove_images(*built)
        r.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, reg):
    assert os.access(CLI, os.X_OK), "run scripts/install-backendai-clients.sh"
    url = f"sqlite:///{tmp_path_factory.mktemp('images-cli')}/backendai.sqlite"
    hub = Hub(db_url=url, backend="local").start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    # The registry, as an admin configures it (the record's row; its password a secret).
    with hub.sm.begin() as s:
        s.add(ContainerRegistry(name="lab", url=reg.url, project="lab", username=reg.username,
                                password=reg.password, ca_cert=reg.ca_pem.decode(),
                                pull_policy="tag"))
    yield hub
    shutdown_hub(hub)
    hub.engine.dispose()


def _push_tiny(reg, tmp_path, repo: str, tag: str) -> str:
    """A labelled kernel image of one file (``FROM scratch``) pushed as ``<repo>:<tag>``
    and gone from the engine again; its reference."""
    d = tmp_path / repo.replace("/", "-")
    d.mkdir()
    (d / "hello").write_text(repo + "\n")
    (d / "Dockerfile").write_text('FROM scratch\nCOPY hello /hello\n'
                                  'LABEL "ai.backend.kernelspec"="1"\n')
    local = image_tag("cli-" + repo.replace("/", "-"))
    subprocess.run(["docker", "build", "-q", "-t", local, str(d)], check=True,
                   capture_output=True)
    try:
        return reg.push(local, repo, tag)
    finally:
        remove_images(local)


def _catalogue(hub) -> dict:
    """The registries' part of the catalogue (the agents' own images, which the hub
    catalogues at its start, left out), each name with its aliases."""
    with hub.sm() as s:
        return {i.name: sorted(a.alias for a in s.query(ImageAlias).filter_by(image=i.name))
                for i in s.query(Image).filter(Image.source != "local")}


def test_cli_lists_rescans_and_aliases_images(hub, reg, tmp_path):
    sa = superadmin(hub)
    root = BAI(hub, new_user(sa, role="superadmin", name=f"root-{uuid.uuid4().hex[:6]}"),
               str(tmp_path / "root"))
    user = BAI(hub, new_user(sa, name=f"u-{uuid.uuid4().hex[:6]}"), str(tmp_path / "user"))
    tiny = f"{reg.host}/lab/tiny:1"

    # A plain user may not rescan; an unknown registry is named; nothing changes.
    out = user("admin", "image", "rescan", "-r", "lab", rc=None)
    assert user.rc != 0 and "only superadmins rescan" in out, out
    out = root("admin", "image", "rescan", "-r", "nowhere", rc=None)
    assert root.rc != 0 and "no container registry 'nowhere'" in out, out
    assert _catalogue(hub) == {}

    out = root("admin", "image", "rescan", "-r", "lab")
    assert "Finished registry scanning" in out, out
    assert _catalogue(hub) == {tiny: []}  # lab/plain has no kernelspec label
    out = root("admin", "image", "list")
    assert "lab/tiny" in out and reg.host in out and "sha256:" in out, out
    assert "lab/plain" not in out

    out = root("admin", "image", "alias", "tiny-py", tiny)
    assert "An alias has created" in out, out
    assert _catalogue(hub) == {tiny: ["tiny-py"]}
    out = root("admin", "image", "alias", "tiny-py", tiny, rc=None)
    assert "names" in out and "already" in out, out
    out = user("admin", "image", "list")  # every user sees the visible catalogue
    assert "tiny-py" in out, out
    out = user("admin", "image", "alias", "mine", tiny, rc=None)
    assert "you may not alias images" in out, out

    bai26 = BAI(hub, root.user, str(tmp_path / "root26"), cli=CLI26)
    out = bai26("admin", "image", "list")
    assert "lab/tiny" in out and "tiny-py" in out, out
    out = bai26("admin", "image", "dealias", "tiny-py")
    assert "The alias has been removed" in out, out
    assert _catalogue(hub) == {tiny: []}
    out = bai26("admin", "image", "rescan", "-r", "lab")
    assert "Finished registry scanning" in out, out


def test_cli_configures_a_registry_through_its_etcd_keys(hub, reg, tmp_path):
    """Backend.AI's way of adding a registry, `admin etcd set config/docker/registry/<host>`
    (the address, then a field; or the whole object), makes a registry of the hub's named
    by its host, which `admin image rescan -r <host>` reads; `get` never shows the
    password; other keys, a plain user, a field of a registry not set up, several
    projects are refused in words and change nothing; `delete --prefix` removes it and its
    images (23.09 client; the 26.09 client's get too)."""
    import urllib.parse

    sa = superadmin(hub)
    root = BAI(hub, new_user(sa, role="superadmin", name=f"root-{uuid.uuid4().hex[:6]}"),
               str(tmp_path / "root"))
    user = BAI(hub, new_user(sa, name=f"u-{uuid.uuid4().hex[:6]}"), str(tmp_path / "user"))
    dadmin = BAI(hub, new_user(sa, role="admin", name=f"da-{uuid.uuid4().hex[:6]}"),
                 str(tmp_path / "dadmin"))
    key = "config/docker/registry/" + urllib.parse.quote(reg.host, safe="")
    before = sa.ok("GET", "/container-registries")["items"]
    tiny = _push_tiny(reg, tmp_path, "etcd/tiny", "1")

    refused = [
        (user, ("admin", "etcd", "set", key, reg.url), "only superadmins"),
        (dadmin, ("admin", "etcd", "get", "config/docker/registry", "--prefix"),
         "only superadmins"),
        (root, ("admin", "etcd", "set", "config/redis/addr", "x"),
         "only the container registries' keys are served here"),
        (root, ("admin", "etcd", "set", key + "/username", reg.username),
         f"no container registry '{reg.host}': set its address first"),
        (root, ("admin", "etcd", "set", key, json.dumps({"": reg.url, "project": "a,b"})),
         "one project per registry here"),
        (root, ("admin", "etcd", "set", key, "ftp://nowhere"), "is not a registry address"),
    ]
    for bai, args, words in refused:
        out = bai(*args, rc=None)
        assert bai.rc != 0 and words in out, (args, out)
    assert sa.ok("GET", "/container-registries")["items"] == before

    # The address, then the fields one by one (as an operator of Backend.AI does).
    root("admin", "etcd", "set", key, reg.url)
    for field, value in (("username", reg.username), ("password", reg.password),
                         ("project", "etcd"), ("type", "docker")):
        # ("--": a generated password may begin with "-", which the CLI would take for
        # an option; an operator writes it the same way)
        out = root("admin", "etcd", "set", "--", f"{key}/{field}", value)
        assert "Successfully set" in out, out
    got = sa.ok("GET", "/container-registries/" + urllib.parse.quote(reg.host, safe=""))
    assert (got["url"], got["username"], got["project"], got["has_password"]) == \
        (reg.url, reg.username, "etcd", True)
    # The engine trusts the CA already (certs.d); the hub's rescan needs it too: the admin
    # API sets it (Backend.AI's keys have no CA).
    sa.ok("PATCH", "/container-registries/" + urllib.parse.quote(reg.host, safe=""),
          json={"ca_cert": reg.ca_pem.decode()})
    out = root("admin", "image", "rescan", "-r", reg.host)
    assert "Finished registry scanning" in out, out
    assert sa.ok("GET", "/images", params={"source": reg.host})["items"][0]["name"] == tiny

    out = root("admin", "etcd", "get", "config/docker/registry", "--prefix")
    assert reg.url in out and reg.username in out and reg.password not in out, out
    out = root("admin", "etcd", "get", key + "/password")
    assert reg.password not in out, out
    bai26 = BAI(hub, root.user, str(tmp_path / "root26"), cli=CLI26)
    out = bai26("admin", "etcd", "get", key)
    assert reg.url in out, out

    out = root("admin", "etcd", "delete", key, "--prefix")
    assert "Successfully deleted" in out, out
    assert sa.ok("GET", "/container-registries")["items"] == before
    assert tiny not in _catalogue(hub)


def test_spawn_form_lists_the_catalogue_default_first(hub, reg):
    """The spawn form offers the catalogue with aliases and descriptions, the default
    preselected (set through the admin API), beside the agents' own images; a hidden
    image is not offered."""
    import html
    import re
    import urllib.parse

    from .api_world import PASSWORD

    sa = superadmin(hub)
    sa.ok("POST", "/container-registries/lab/rescan", status=200)
    tiny = f"{reg.host}/lab/tiny:1"
    q = urllib.parse.quote(tiny, safe="")
    sa.ok("PATCH", f"/images/{q}", json={"is_default": True, "description": "A tiny one"})
    sa.ok("POST", f"/images/{q}/aliases", json={"alias": f"tiny-{uuid.uuid4().hex[:4]}"})
    # A local image, catalogued from the agents and then hidden.
    sa.ok("POST", "/container-registries/local/rescan", status=200)
    local = sa.ok("GET", "/images", params={"source": "local"})["items"]
    assert [i["name"] for i in local] == ["local/python"]
    u = new_user(sa, name=f"form-{uuid.uuid4().hex[:6]}")
    s = hub.login(u["email"], PASSWORD)
    page = html.unescape(s.get(hub.base + "/hub/spawn").text)
    options = re.findall(r'<option value="([^"]+)"( selected)?>([^<]*)</option>', page)
    offered = {v: (bool(sel), label) for v, sel, label in options}
    assert offered[tiny][0] is True, options
    assert "A tiny one" in offered[tiny][1] and "tiny-" in offered[tiny][1]
    assert offered["local/python"][0] is False
    # the default is first
    assert [v for v, _, _ in options if v in (tiny, "local/python")][0] == tiny

    sa.ok("PATCH", "/images/local%2Fpython", json={"hidden": True})
    page = html.unescape(s.get(hub.base + "/hub/spawn").text)
    assert 'value="local/python"' not in page  # held by the agent, but hidden
    r = s.post(hub.base + f"/hub/spawn/{u['username']}/hidden", data={
        "image": "local/python", "cpu": "0.5", "mem": "256m",
        "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
    assert "image 'local/python' is hidden" in html.unescape(r.text), r.text[-2000:]
    assert sa.ok("GET", "/sessions", params={"user_id": u["id"]})["total"] == 0
    sa.ok("PATCH", "/images/local%2Fpython", json={"hidden": False})
    sa.ok("PATCH", f"/images/{q}", json={"is_default": False})


def test_console_environments_page(hub, reg):
    """The console's Environments page: registries with a Rescan button, the catalogue
    with labels and Hide/Show and Make default buttons whose API calls work; not a page
    for plain users."""
    import html
    import re

    from .api_world import PASSWORD

    sa = superadmin(hub)
    sa.ok("POST", "/container-registries/lab/rescan", status=200)
    tiny = f"{reg.host}/lab/tiny:1"
    s = hub.login()  # the hub's admin (superadmin)
    page = html.unescape(s.get(hub.base + "/hub/backendai/admin/environments").text)
    assert 'data-api-path="container-registries/lab/rescan"' in page
    assert 'data-api-path="container-registries/local/rescan"' in page
    assert f"<code>{tiny}</code>" in page and "ai.backend.resource.min.cpu" in page
    row = page[page.index(f'<tr data-name="{tiny}">'):]
    row = row[:row.index("</tr>")]
    # Its minimums in people's units (the label says "64m": once a 500 of the page).
    assert "<td>0.5 cores, 64 MiB memory</td>" in row, row
    buttons = re.findall(r'data-api-method="(\w+)" data-api-path="([^"]+)"\s+'
                         r"data-api-body='([^']+)'", row)
    hide = next(b for b in buttons if "hidden" in b[2])
    assert json.loads(hide[2]) == {"hidden": True}
    sa.ok(hide[0], "/" + hide[1], json=json.loads(hide[2]))
    assert sa.ok("GET", "/" + hide[1])["hidden"] is True
    page = html.unescape(s.get(hub.base + "/hub/backendai/admin/environments").text)
    row = page[page.index(f'<tr data-name="{tiny}">'):]
    assert ">Show</button>" in row[:row.index("</tr>")]
    sa.ok("PATCH", "/" + hide[1], json={"hidden": False})

    u = new_user(sa, name=f"plain-{uuid.uuid4().hex[:6]}")
    us = hub.login(u["email"], PASSWORD)
    r = us.get(hub.base + "/hub/backendai/admin/environments")
    assert r.status_code in (403, 404) and tiny not in r.text


def test_console_rescan_shows_its_progress(hub, reg, tmp_path):
    """In Chromium: the Environments page's Rescan follows the rescan while it reads (the
    registry's row says how many of its 301 tags were read), then says what it found; the
    API answers the same progress; a registry removed takes its images with it."""
    from .chromium import chromium, logged_in
    from .hub import ADMIN_EMAIL, ADMIN_PASSWORD

    sa = superadmin(hub)
    _push_tiny(reg, tmp_path, "bulk/tiny", "0")
    reg.add_tags("bulk/tiny", "0", [f"t{i:03d}" for i in range(300)])
    sa.ok("POST", "/container-registries", status=201, json={
        "name": "bulk", "url": reg.url, "project": "bulk", "username": reg.username,
        "password": reg.password, "ca_cert": reg.ca_pem.decode()})
    try:
        with chromium() as browser:
            ctx, page, errors = logged_in(browser, hub, ADMIN_EMAIL, ADMIN_PASSWORD)
            seen: list[str] = []
            # Every text the rescan cell shows, across the reload that ends the rescan.
            def saw(text: str) -> None:
                seen.append(text)

            page.expose_function("backendaiSeen", saw)
            ctx.add_init_script("""
              document.addEventListener("DOMContentLoaded", () => {
                const cell = document.querySelector(
                  '#backendai-registries tr[data-name="bulk"] .backendai-rescan');
                if (!cell) { return; }
                window.backendaiSeen(cell.textContent);
                new MutationObserver(() => window.backendaiSeen(cell.textContent))
                  .observe(cell, {childList: true, characterData: true, subtree: true});
              });""")
            page.goto(hub.base + "/hub/backendai/admin/environments")
            row = page.locator('#backendai-registries tr[data-name="bulk"]')
            row.get_by_role("button", name="Rescan").click()
            page.locator("#backendai-message").filter(has_text="Rescanned bulk.").wait_for()
            cell = page.locator('#backendai-registries tr[data-name="bulk"] .backendai-rescan')
            assert cell.inner_text() == "301 images (301 new, 0 changed, 0 gone)"
            reading = [t for t in seen if re.fullmatch(r"\d+ of 301 images read", t)]
            assert reading, seen  # the progress, shown while it ran
            counts = [int(t.split()[0]) for t in reading]
            assert counts == sorted(counts) and counts[-1] <= 301, reading
            assert errors == []
            ctx.close()
        got = sa.ok("GET", "/container-registries/bulk")["rescan"]
        assert (got["state"], got["done"], got["total"]) == ("done", 301, 301)
        assert len(sa.ok("GET", "/images", params={"source": "bulk", "limit": 500})
                   ["items"]) == 301
    finally:
        sa.ok("DELETE", "/container-registries/bulk", status=204)
    assert sa.ok("GET", "/images", params={"source": "bulk"})["items"] == []


def test_gpu_images_only_where_the_group_has_gpus(hub, reg, tmp_path):
    """A GPU image (``ai.backend.accelerators=cuda``, at least one GPU) is not offered in
    the form of a group without GPUs (this hub's local agent has none), while the other
    images are; a hub whose agent has GPUs (an NVML stand-in: no GPU on CI) offers it."""
    import html
    import re

    from .api_world import PASSWORD

    d = tmp_path / "cuda"
    d.mkdir()
    (d / "hello").write_text("hello\n")
    (d / "Dockerfile").write_text(
        'FROM scratch\nCOPY hello /hello\nLABEL "ai.backend.kernelspec"="1" '
        '"ai.backend.accelerators"="cuda" "ai.backend.resource.min.cuda.device"="1"\n')
    tag = image_tag("cli-cuda")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(d)], check=True,
                   capture_output=True)
    try:
        reg.push(tag, "lab/cuda", "1")
    finally:
        remove_images(tag)
    cuda, tiny = f"{reg.host}/lab/cuda:1", f"{reg.host}/lab/tiny:1"

    def offered(h) -> list[str]:
        sa = superadmin(h)
        sa.ok("POST", "/container-registries/lab/rescan", status=200)
        assert {cuda, tiny} <= {i["name"] for i in sa.ok("GET", "/images")["items"]}
        u = new_user(sa, name=f"gpu-{uuid.uuid4().hex[:6]}")
        page = html.unescape(h.login(u["email"], PASSWORD).get(h.base + "/hub/spawn").text)
        return re.findall(r'<option value="([^"]+)"', page)

    names = offered(hub)
    assert tiny in names and cuda not in names, names

    url = f"sqlite:///{tmp_path}/gpu.sqlite"
    gpu_hub = Hub(db_url=url, backend="local",
                  extra_args=["--Agent.nvml_stand_in=a100-mig"]).start()
    try:
        with make_sessionmaker(make_engine(url)).begin() as s:
            s.add(ContainerRegistry(name="lab", url=reg.url, project="lab",
                                    username=reg.username, password=reg.password,
                                    ca_cert=reg.ca_pem.decode(), pull_policy="tag"))
        names = offered(gpu_hub)
        assert tiny in names and cuda in names, names
    finally:
        shutdown_hub(gpu_hub)



_LISTEN_LATE = """
import asyncio, json, sys
from ai.backend.client.cli.pretty import ProgressViewer
from ai.backend.client.session import AsyncSession

async def main():
    async with AsyncSession() as session:
        started = await session.Image.rescan_images(sys.argv[1])
        print(started["task_id"], flush=True)
        sys.stdin.readline()  # the test says when the rescan has ended
        events = []
        # What `backend.ai admin image rescan` does once it has the task (23.09's own classes).
        async with (session.BackgroundTask(started["task_id"]).listen_events() as response,
                    ProgressViewer("Scanning the registry...")):
            async for ev in response:
                events.append(ev.event)
        print(json.dumps(events), flush=True)

asyncio.run(main())
"""


def test_cli_follows_a_rescan_that_ended_before_it_listened(hub, reg, tmp_path):
    """The race CI met: the hub finished a rescan before the 23.09 CLI opened its event
    stream, answered the whole stream at once, and the CLI's spinner, cancelled before it
    had ever run, raised CancelledError (``admin image rescan`` exited 1). Here the client
    listens only after the hub says the rescan is done, with the CLI's own classes."""
    sa = superadmin(hub)
    root = BAI(hub, new_user(sa, role="superadmin", name=f"root-{uuid.uuid4().hex[:6]}"),
               str(tmp_path / "root"))
    before = (sa.ok("GET", "/container-registries/lab")["rescan"] or {}).get("started_at")
    python = os.path.join(os.path.dirname(CLI), "python")
    p = subprocess.Popen([python, "-c", _LISTEN_LATE, "lab"], env=root.env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline().strip(), p.stderr.read()
        deadline = time.monotonic() + 60
        while True:
            scan = sa.ok("GET", "/container-registries/lab")["rescan"] or {}
            if scan.get("started_at") != before and scan.get("state") == "done":
                break
            assert time.monotonic() < deadline, "the rescan never ended"
            time.sleep(0.05)
        out, err = p.communicate("go\n", timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == ["bgtask_done", "server_close"], out
