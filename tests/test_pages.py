"""The pages under /hub/backendai/ (My sessions, My folders, My keys, the admin console)
against a real hub: who gets which page, and that a domain admin's console shows nothing
of another domain (the same access rules as the REST API)."""

from __future__ import annotations

import re
import shutil
import time

import pytest
from markupsafe import escape

from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .api_world import PASSWORD, Client, superadmin
from .hub import Hub

SECTIONS = ["domains", "projects", "users", "keypairs", "policies", "resource-groups", "presets",
            "agents", "environments", "sessions", "queue", "usage", "plots"]
USER_PAGES = ["sessions", "folders", "keys"]


def _user(sa: Client, name: str, role: str, domain: str, projects=None) -> dict:
    body = {"email": f"{name}@example.com", "password": PASSWORD, "username": name,
            "role": role, "domain_name": domain}
    if projects:
        body["project_ids"] = projects
    u = sa.ok("POST", "/users", json=body)
    u["web"] = sa.hub.login(u["email"], PASSWORD)
    assert u["web"].last_login.status_code == 200, u["web"].last_login.text
    u["client"] = Client(sa.hub, sa.hub.token_for(u["web"], name), name)
    return u


REASON = "no agent in resource group 'parked' (no agent)"


def _park(hub: Hub, user: dict, name: str) -> str:
    """A PENDING session with resources and a reason, in a group without agents."""
    from jupyterhub_backendai.common.slots import ResourceSlot
    from jupyterhub_backendai.models import Kernel, Session

    with hub.sm.begin() as s:
        sess = Session(
            name=name, session_type="batch", user_id=user["id"],
            access_key=user["keypair"]["access_key"], domain_name=user["domain_name"],
            project_id=(user["project_ids"] or [None])[0], resource_group="parked",
            image="local/python", startup_command="true", status="PENDING",
            status_info=REASON, requested_slots=ResourceSlot(cpu="0.5", mem=256 * 2**20))
        sess.kernels.append(Kernel(status="PENDING"))
        s.add(sess)
        s.flush()
        return sess.id


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("pages")
    url = f"sqlite:///{d}/backendai.sqlite"
    # Use samples twice a second for the plots (the default is every 30 s). The agent's
    # GPUs are an NVML STAND-IN's (a100-mig: GPU 0 in MIG mode, GPU 1 whole; described,
    # not real, figures made up): the console's per-GPU rows.
    hub = Hub(db_url=url, backend="local", extra_args=[
        "--UsageSeries.interval=0.5", "--Agent.nvml_stand_in=a100-mig"]).start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    try:
        sa = superadmin(hub)
        from jupyterhub_backendai.common.types import HOST_PERMISSIONS

        sa.ok("POST", "/domains", json={
            "name": "otherdom", "allowed_vfolder_hosts": {"local:volume1": list(HOST_PERMISSIONS)}})
        proj_b = sa.ok("POST", "/projects", json={"name": "secretproj", "domain_name": "otherdom"})
        proj_a = sa.ok("POST", "/projects", json={"name": "teamproj", "domain_name": "default"})
        # A public resource group without agents: sessions there wait, with a reason.
        sa.ok("POST", "/resource-groups", json={"name": "parked", "is_public": True})
        w = {"hub": hub, "sa": sa, "proj_a": proj_a, "proj_b": proj_b}
        w["user"] = _user(sa, "pageuser", "user", "default", [proj_a["id"]])
        w["monitor"] = _user(sa, "pagemonitor", "monitor", "default")
        w["dadmin"] = _user(sa, "pagedadmin", "admin", "default")
        w["user_b"] = _user(sa, "hiddenuser", "user", "otherdom", [proj_b["id"]])
        for who, name in (("user", "visiblesession"), ("user_b", "hiddensession")):
            _park(hub, w[who], name)
        w["folder_b"] = w["user_b"]["client"].ok("POST", "/vfolders", json={"name": "hiddenfolder"})
        yield w
    finally:
        hub.close()
        hub.engine.dispose()
        shutil.rmtree(hub.dir, ignore_errors=True)


def _get(w, who: str, path: str, **kw):
    return w[who]["web"].get(w["hub"].base + "/hub/backendai/" + path, allow_redirects=False,
                             timeout=60, **kw)


@pytest.mark.parametrize("page", USER_PAGES)
def test_user_pages_for_every_role(world, page):
    for who in ("user", "monitor", "dadmin"):
        r = _get(world, who, page)
        assert r.status_code == 200, (who, page, r.status_code, r.text[-2000:])
    r = world["sa"].http.get(world["hub"].base + "/hub/backendai/" + page, allow_redirects=False)
    assert r.status_code == 302 and "/hub/login" in r.headers["Location"]


def test_my_sessions_shows_the_session_in_human_units(world):
    r = _get(world, "user", "sessions")
    row = re.search(r'<tr data-session-id="[^"]+" data-session-name="visiblesession">(.*?)</tr>',
                    r.text, re.S)
    assert row, r.text[-3000:]
    assert "PENDING" in row.group(1)
    assert "0.5 cores, 256 MiB memory" in row.group(1)
    assert "parked" in row.group(1)
    assert ">Stop</button>" in row.group(1)
    assert "hiddensession" not in r.text


def test_session_logs_page(world):
    sid = re.search(r'data-session-id="([^"]+)" data-session-name="visiblesession"',
                    _get(world, "user", "sessions").text).group(1)
    assert _get(world, "user", f"sessions/{sid}/logs").status_code == 200
    # Someone else's session: not found (the API's rule: unseen objects are missing).
    r = _get(world, "user_b", f"sessions/{sid}/logs")
    assert r.status_code == 404
    assert escape(f"no session {sid!r}") in r.text


def _running_with_apps(hub: Hub, user: dict, name: str) -> str:
    """A RUNNING interactive session record whose main kernel declares the shipped
    image's apps and a published sshd (what the Docker agent records; no kernel runs:
    the page reads the record, as the API's service-ports answer does)."""
    from jupyterhub_backendai.common.slots import ResourceSlot
    from jupyterhub_backendai.models import Kernel, Session

    ports = [{"name": "jupyter", "protocol": "http", "container_port": 8888, "host_port": 30001},
             {"name": "tensorboard", "protocol": "http", "container_port": 6006},
             {"name": "hello", "protocol": "http", "container_port": 8070},
             {"name": "sshd", "protocol": "tcp", "container_port": 2200, "host_port": 30002}]
    with hub.sm.begin() as s:
        sess = Session(
            name=name, session_type="interactive", user_id=user["id"],
            access_key=user["keypair"]["access_key"], domain_name=user["domain_name"],
            project_id=(user["project_ids"] or [None])[0], resource_group="parked",
            image="local/python", status="RUNNING", service_prefix=f"/user/{user['username']}/{name}/",
            requested_slots=ResourceSlot(cpu="0.5", mem=256 * 2**20))
        sess.kernels.append(Kernel(status="RUNNING", kernel_host="10.9.8.7", service_ports=ports))
        s.add(sess)
        s.flush()
        return sess.id


def test_my_sessions_links_the_service_ports_as_the_api_does(world):
    hub = world["hub"]
    sid = _running_with_apps(hub, world["user"], "appsession")
    try:
        api = world["user"]["client"].ok("GET", f"/sessions/{sid}/service-ports")
        want = {sp["name"]: sp["url"].removeprefix(hub.base) for sp in api["service_ports"]
                if sp["url"]}
        assert want == {"jupyter": "/user/pageuser/appsession/",
                        "tensorboard": "/user/pageuser/appsession/tensorboard/",
                        "hello": "/user/pageuser/appsession/hello/"}, api
        for who, page in (("user", "sessions"), ("dadmin", "admin/sessions?status=RUNNING")):
            text = _get(world, who, page).text
            row = re.search(rf'<tr data-session-id="{sid}"[^>]*>(.*?)</tr>', text, re.S)
            assert row, (who, text[-3000:])
            cell = re.search(r'<td class="backendai-apps">(.*?)</td>', row.group(1), re.S).group(1)
            links = dict((n, u) for u, n in re.findall(
                r'<a href="([^"]+)"[^>]*data-app="([^"]+)"', cell))
            assert links == want, (who, cell)
            # The published sshd: where to connect, not a link.
            assert re.search(r'data-app="sshd">sshd: <code>10\.9\.8\.7:30002</code>', cell), cell
        # A session that is not running has no apps; someone else's is not shown at all.
        mine = _get(world, "user", "sessions").text
        pending = re.search(r'data-session-name="visiblesession">(.*?)</tr>', mine, re.S).group(1)
        assert re.search(r'<td class="backendai-apps">\s*-\s*</td>', pending), pending
        assert sid not in _get(world, "user_b", "sessions").text
    finally:
        # Ended, so that no other test sees a running session without a kernel.
        with hub.sm.begin() as s:
            from jupyterhub_backendai.models import Session

            sess = s.get(Session, sid)
            sess.status = "TERMINATED"
            for k in sess.kernels:
                k.status = "TERMINATED"


def test_live_view_counts_every_kernel_and_names_only_visible_ones():
    from jupyterhub_backendai.pages.console import live_view

    stats = {"ts": 1000.0, "available_slots": {"cpu": "4", "mem": str(8 * 2**30)},
             "kernels": {
                 "k1": {"cpu_pct": 150.0, "mem_bytes": 300 * 2**20,
                        "mem_limit_bytes": 2**30, "gpu_util_pct": 42.5},
                 "k2": {"cpu_pct": None, "mem_bytes": 100 * 2**20,
                        "mem_limit_bytes": 2**30, "gpu_util_pct": None},
                 "k3": {"cpu_pct": 50.0, "mem_bytes": 2**30, "mem_limit_bytes": 0}}}
    seen = {"k1": {"session": "mine", "session_id": "s1", "user": "alice"},
            "k2": {"session": "fresh", "session_id": "s2", "user": "alice"}}
    v = live_view(stats, seen, now=1075.0)
    # Totals count the kernel outside the view (k3) too; its session is not named.
    assert v["cpu"] == "2.00 of 4 cores busy"
    # k3 has no memory limit: no total limit is claimed.
    assert v["mem"] == "1.4 GiB in use", v["mem"]
    assert live_view({**stats, "kernels": {"k1": stats["kernels"]["k1"]}}, seen, now=1000.0)[
        "mem"] == "300 MiB in use of 1 GiB allowed"
    assert v["age"] == "1 min" and v["kernels"] == 3 and v["hidden"] == 1
    assert [(r["session"], r["cpu"], r["mem"], r["mem_limit"], r["gpu"]) for r in v["rows"]] == [
        ("fresh", "-", "100 MiB", "1 GiB", "-"), ("mine", "150%", "300 MiB", "1 GiB", "42.5%")]
    assert live_view(None, seen, now=1.0) is None


def test_console_agents_show_live_statistics(world):
    """The embedded agent's last sample (no Redis here: the hub reads the agent in its
    process); it samples every heartbeat, so the first may take one."""
    deadline = time.monotonic() + 40
    while True:
        text = _get(world, "dadmin", "admin/agents").text
        live = re.search(r'<td class="small backendai-live">(.*?)</td>\s*<td class="small">',
                         text, re.S)
        assert live, text[-3000:]
        if "sampled" in live.group(1) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert re.search(r"cores busy; .* in use .*\(sampled .* ago, 0 kernels\)", live.group(1),
                     re.S), live.group(1)


def _gpu_rows(w, who: str) -> dict[str, list[str]]:
    """The embedded agent's per-GPU table: {GPU column: [the row's cells]}."""
    text = _get(w, who, "admin/agents").text
    table = re.search(r'<table class="table table-sm mb-0 backendai-live-gpus">(.*?)</table>',
                      text, re.S)
    assert table, text[-3000:]
    rows = {}
    for row in re.findall(r"<tr data-gpu=.*?</tr>", table.group(1), re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td>(.*?)</td>", row,
                                                                         re.S)]
        rows[cells[0]] = cells
    return rows


def test_console_agents_show_each_gpu_and_who_holds_it(world):
    """Per-GPU rows of the embedded agent, whose GPUs are the NVML stand-in's (figures
    made up: 0 until set). A GPU taken by a session the viewer may see names it, after
    the agent's next sample; after the session ends it is free again."""
    rows = _gpu_rows(world, "dadmin")
    # GPU 0 in MIG mode: no utilisation, said so; its four instances; GPU 1 whole.
    assert list(rows) == ["0", "0:0", "0:1", "0:2", "0:3", "1"], rows
    assert rows["0"][1:] == ["NVIDIA A100-SXM4-80GB", "NVML gives no utilisation under MIG",
                             "0 bytes of 80 GiB", "free"]
    assert rows["0:2"][1:3] == ["NVIDIA A100-SXM4-80GB MIG 1g.10gb",
                                "NVML gives no utilisation under MIG"]
    assert rows["1"][1:] == ["NVIDIA A100-SXM4-80GB", "0%", "0 bytes of 80 GiB", "free"]
    c = world["user"]["client"]
    s = c.ok("POST", "/sessions", json={
        "name": "gpuholder", "image": "local/python", "startup_command": "sleep 120",
        "resources": {"cpu": "0.25", "mem": "128m", "gpu": 1}})
    try:
        deadline = time.monotonic() + 30  # one heartbeat (10 s) after it runs
        while rows["1"][4] == "free" and time.monotonic() < deadline:
            time.sleep(1)
            rows = _gpu_rows(world, "dadmin")
        assert rows["1"][4] == "gpuholder (pageuser)", (rows, c.ok("GET", f"/sessions/{s['id']}"))
        assert [r[4] for k, r in rows.items() if k != "1"] == ["free"] * 5
    finally:
        c.ok("DELETE", f"/sessions/{s['id']}")
    deadline = time.monotonic() + 30
    while rows["1"][4] != "free" and time.monotonic() < deadline:
        time.sleep(1)
        rows = _gpu_rows(world, "dadmin")
    assert rows["1"][4] == "free"


def test_gpu_rows_name_only_visible_holders():
    from jupyterhub_backendai.pages.console import gpu_rows, live_view

    gpus = [
        {"index": 0, "uuid": "GPU-a", "name": "A100", "parent_index": None, "util_pct": 55.0,
         "mem_used_bytes": 2**30, "mem_total_bytes": 80 * 2**30, "note": "", "kernel_id": "k1"},
        {"index": 1, "uuid": "GPU-b", "name": "A100", "parent_index": None, "util_pct": 10.0,
         "mem_used_bytes": 0, "mem_total_bytes": 80 * 2**30, "note": "", "kernel_id": "k9"},
        {"index": 0, "uuid": "MIG-c", "name": "A100 MIG 1g.10gb", "parent_index": 2,
         "util_pct": None, "mem_used_bytes": None, "mem_total_bytes": None,
         "note": "NVML gives no utilisation under MIG", "kernel_id": None},
    ]
    seen = {"k1": {"session": "mine", "session_id": "s1", "user": "alice"}}
    rows = gpu_rows(gpus, seen)
    assert [(r["index"], r["util"], r["mem"], r["held"]) for r in rows] == [
        ("0", "55%", "1 GiB of 80 GiB", "mine (alice)"),
        ("1", "10%", "0 bytes of 80 GiB", "a session outside your view"),
        ("2:0", "NVML gives no utilisation under MIG", "-", "free")]
    # The hidden holder's kernel id and session are not passed to the page either.
    assert (rows[1]["kernel"], rows[1]["session"], rows[1]["hidden"]) == ("", "", True)
    # The agent's view counts them.
    v = live_view({"ts": 1.0, "kernels": {}, "gpus": gpus}, seen, now=1.0)
    assert v["gpus"] == rows and v["gpus_hidden"] == 1


def test_spawn_form_bounds_follow_each_projects_quota(world):
    """Each project's quota limit rides on its option; the page's script moves the CPU
    field's max to the chosen project's (checked in the browser by test_browser_pages)."""
    sa = world["sa"]
    small = sa.ok("POST", "/projects", json={"name": "smallproj", "domain_name": "default"})
    sa.ok("PATCH", f"/projects/{small['id']}", json={"total_resource_slots": {"cpu": "1"}})
    u = _user(sa, "twoprojuser", "user", "default", [world["proj_a"]["id"], small["id"]])
    r = u["web"].get(world["hub"].base + "/hub/spawn/twoprojuser/bounds", timeout=60)
    assert r.status_code == 200, r.text[-2000:]
    options = {name: attrs for attrs, name in re.findall(
        r'<option value="[^"]+"([^>]*)>([^<]+)</option>', r.text)
        if name in ("smallproj", "teamproj")}
    assert 'data-cpu-max="1"' in options["smallproj"], options
    assert 'data-cpu-max=""' in options["teamproj"], options  # no limit at any level


def test_folders_of_others_are_not_found(world):
    fid = world["folder_b"]["id"]
    assert _get(world, "user_b", f"folders/{fid}").status_code == 200
    for who in ("user", "dadmin"):
        r = _get(world, who, f"folders/{fid}")
        assert r.status_code == 404, (who, r.status_code)
        assert escape(f"no vfolder {fid!r}") in r.text
    assert "hiddenfolder" not in _get(world, "dadmin", "folders").text


def test_keys_page_lists_only_own_keys(world):
    ak = world["user"]["keypair"]["access_key"]
    other = world["user_b"]["keypair"]["access_key"]
    text = _get(world, "user", "keys").text
    assert f'data-access-key="{ak}"' in text
    assert other not in text
    assert 'href="/hub/backendai/password"' in text


@pytest.mark.parametrize("section", SECTIONS)
def test_console_refuses_users_and_monitors(world, section):
    for who, role in (("user", "user"), ("monitor", "monitor")):
        r = _get(world, who, f"admin/{section}")
        assert r.status_code == 403, (who, section, r.status_code)
        assert (f"The admin console is for superadmins and domain admins; your role is {role}."
                in r.text)


@pytest.mark.parametrize("section", SECTIONS)
def test_domain_admin_sees_nothing_of_another_domain(world, section):
    r = _get(world, "dadmin", f"admin/{section}")
    assert r.status_code == 200, r.text[-2000:]
    for secret in ("otherdom", "secretproj", "hiddenuser", "hiddensession",
                   world["user_b"]["keypair"]["access_key"]):
        assert secret not in r.text, (section, secret)
    assert "Domain admin of default: this domain only." in r.text
    # The superadmin's console has both domains' rows where the section lists them.
    sa = world["hub"].login()
    everything = sa.get(world["hub"].base + f"/hub/backendai/admin/{section}", timeout=60).text
    expected = {"domains": "otherdom", "projects": "secretproj", "users": "hiddenuser",
                "keypairs": world["user_b"]["keypair"]["access_key"],
                "sessions": "hiddensession", "queue": "hiddensession"}.get(section)
    if expected:
        assert expected in everything, section


def test_domain_admin_sees_own_domain_rows(world):
    users = _get(world, "dadmin", "admin/users").text
    assert 'data-username="pageuser"' in users
    projects = _get(world, "dadmin", "admin/projects").text
    assert 'data-name="teamproj"' in projects and "pageuser" in projects
    queue = _get(world, "dadmin", "admin/queue").text
    section = re.search(r'data-resource-group="parked".*?</section>', queue, re.S).group(0)
    # Counted and listed: the sessions the admin may see; the group's total as the API has it.
    assert "1 pending in your view (2 in the group)" in section
    assert 'data-session-name="visiblesession"' in section
    sid = re.search(r'data-session-id="([^"]+)" data-session-name="visiblesession"',
                    _get(world, "user", "sessions").text).group(1)
    reason = world["user"]["client"].ok("GET", f"/sessions/{sid}")["status_info"]
    assert reason  # the scheduler's words (it replaced the one the test wrote)
    assert '<td class="backendai-reason">' + str(escape(reason)) + "</td>" in section
    sessions = _get(world, "dadmin", "admin/sessions", params={"status": "PENDING"}).text
    assert 'data-session-name="visiblesession"' in sessions and ">Force-stop</button>" in sessions


def _plot(html: str, pid: str) -> str:
    m = re.search(rf'<figure class="backendai-plot mb-4" id="plot-{pid}" data-points="(\d+)">(.*?)</figure>',
                  html, re.S)
    assert m, html[-3000:]
    return m


def test_plots_draw_the_samples(world):
    """The hub samples the record; after a few samples the console draws them: the
    queue of 'parked' (2 pending: the group's count) and the agent's use, as SVG."""
    deadline = time.monotonic() + 60
    while True:
        r = _get(world, "dadmin", "admin/plots")
        assert r.status_code == 200, r.text[-2000:]
        queue = _plot(r.text, "queue-length")
        if int(queue.group(1)) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert int(queue.group(1)) >= 3, r.text[-3000:]
    body = queue.group(2)
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in body
    assert 'aria-labelledby="plot-queue-length-title"' in body
    assert '<g class="backendai-series" data-label="parked">' in body
    assert len(re.findall(r"<circle ", body)) == int(queue.group(1))
    assert "<title>parked: 2 sessions at " in body
    assert "parked: 2 sessions now" in body
    agents = _plot(r.text, "agent-cpu")
    assert int(agents.group(1)) >= 3
    assert f'data-label="{world["hub"].agent_id}"' in agents.group(2)
    assert re.search(r"\d+ samples kept by this hub, one every 0.5 s;", r.text)


def test_console_bad_input(world):
    r = _get(world, "dadmin", "admin/nonsense")
    assert r.status_code == 404
    assert "There is no console page &#39;nonsense&#39;." in r.text
    r = _get(world, "dadmin", "admin/sessions", params={"status": "SLEEPING"})
    assert r.status_code == 400
    assert "status must be one of PENDING" in r.text and "not &#39;SLEEPING&#39;" in r.text


def test_navigation_links_by_role(world):
    for who, console in (("user", False), ("monitor", False), ("dadmin", True)):
        home = world[who]["web"].get(world["hub"].base + "/hub/home", timeout=60).text
        for page in ("sessions", "folders", "keys", "dotfiles", "password"):
            assert f'id="backendai-nav-{page}"' in home, (who, page)
        assert ('id="backendai-nav-console"' in home) is console, who
    home = world["hub"].login().get(world["hub"].base + "/hub/home", timeout=60).text
    assert 'id="backendai-nav-console"' in home


# -- the console's edit and delete controls --------------------------------------------


def _controls(html: str) -> dict:
    """The console's edit forms (id -> API path) and delete buttons (API paths) on a page."""
    edits = dict(re.findall(r'<form class="backendai-edit[^"]*" id="([^"]+)" data-api-path="([^"]+)"',
                            html))
    deletes = re.findall(r'class="btn btn-sm btn-outline-danger backendai-delete" '
                         r'data-api-method="DELETE"\s+data-api-path="([^"]+)"', html)
    return {"edit": edits, "delete": deletes}


def test_console_controls_follow_the_access_rules(world):
    """Each role is offered the changes the API accepts from it, and no others."""
    sa = world["hub"].login()
    user = world["user"]

    def page(who, section):
        r = (sa.get(world["hub"].base + f"/hub/backendai/admin/{section}", timeout=60)
             if who == "sa" else _get(world, who, f"admin/{section}"))
        assert r.status_code == 200, r.text[-2000:]
        return _controls(r.text)

    # Domains, policies, resource groups are the installation's: superadmins only.
    for section in ("domains", "policies", "resource-groups"):
        got = page("dadmin", section)
        assert got == {"edit": {}, "delete": []}, (section, got)
    got = page("sa", "domains")
    assert got["edit"]["edit-domain-otherdom"] == "domains/otherdom"
    assert "domains/otherdom" in got["delete"] and "domains/default" not in got["delete"]
    got = page("sa", "policies")
    assert got["edit"]["edit-keypair-policy-default"] == "keypair-resource-policies/default"
    assert got["edit"]["edit-user-policy-default"] == "user-resource-policies/default"
    assert not any(d.endswith("/default") for d in got["delete"])
    got = page("sa", "resource-groups")
    assert "resource-groups/parked" in got["delete"] and "resource-groups/default" not in got["delete"]

    # Users: a domain admin edits the domain's users, deletes them but not themselves,
    # and nothing of a superadmin's.
    got = page("dadmin", "users")
    assert got["edit"]["edit-user-pageuser"] == f"users/{user['id']}"
    assert "edit-user-pagedadmin" in got["edit"]  # their own name, email, password
    assert "edit-user-admin" not in got["edit"]
    assert f"users/{user['id']}" in got["delete"]
    assert f"users/{world['dadmin']['id']}" not in got["delete"]
    html = _get(world, "dadmin", "admin/users").text
    own = re.search(r'<form class="backendai-edit[^>]*id="edit-user-pagedadmin".*?</form>',
                    html, re.S).group(0)
    assert 'name="role"' not in own and 'name="resource_policy"' not in own  # not their own
    other = re.search(r'<form class="backendai-edit[^>]*id="edit-user-pageuser".*?</form>',
                      html, re.S).group(0)
    assert 'name="role"' in other and 'name="resource_policy"' in other

    # Keypairs: the main keypair is not offered for deletion (the API refuses it).
    ak = user["keypair"]["access_key"]
    got = page("dadmin", "keypairs")
    assert got["edit"][f"edit-keypair-{ak}"] == f"keypairs/{ak}"
    assert f"keypairs/{ak}" not in got["delete"]

    # Projects: edited and deleted by the domain's admin, members added and removed.
    got = page("dadmin", "projects")
    pid = world["proj_a"]["id"]
    assert got["edit"][f"edit-project-{pid}"] == f"projects/{pid}"
    assert f"projects/{pid}" in got["delete"]
    html = _get(world, "dadmin", "admin/projects").text
    assert f'data-api-path="projects/{pid}/members/{user["id"]}"' in html
    assert f'<form class="row g-1 mt-1 backendai-add-member" data-project="{pid}">' in html


def _as_page(w, who: str, method: str, path: str, body=None):
    """What a console button does: the hub's API with the login cookie and the page's
    XSRF token."""
    web = w[who]["web"] if who != "sa" else w.setdefault("sa_web", w["hub"].login())
    return web.request(method, w["hub"].base + "/hub/api/backendai/" + path, json=body,
                       headers={"X-XSRFToken": web.cookies.get("_xsrf", path="/hub/")},
                       timeout=60)


@pytest.mark.parametrize("who, method, path, body, status, detail", [
    # Refused by role, in words.
    ("dadmin", "PATCH", "domains/default", {"description": "x"}, 403, "you may not change domains"),
    ("dadmin", "DELETE", "resource-groups/parked", None, 403,
     "you may not delete resource groups"),
    ("dadmin", "PATCH", "keypair-resource-policies/default", {"max_concurrent_sessions": 3}, 403,
     "you may not change the keypair resource policy 'default'"),
    # Bad input, in words.
    ("dadmin", "PATCH", "keypairs/{ak}", {"rate_limit": "lots"}, 400,
     "rate_limit: must be a whole number"),
    ("sa", "PATCH", "domains/otherdom", {"total_resource_slots": {"mem": "plenty"}}, 400,
     "total_resource_slots.mem: invalid size: 'plenty' (use e.g. 512m, 2g)"),
    ("sa", "PATCH", "resource-groups/parked", {"allowed_domains": ["nodomain"]}, 400,
     "allowed_domains: no domain 'nodomain'"),
    ("sa", "DELETE", "domains/default", None, 409, "the default domain cannot be deleted"),
    ("dadmin", "DELETE", "users/{me}", None, 409, "you cannot delete yourself"),
    ("dadmin", "PATCH", "users/{uid}", {"email": "not-an-email"}, 400,
     "email: 'not-an-email' is not an email address"),
])
def test_console_refusals_are_plain_words_and_change_nothing(world, who, method, path, body,
                                                             status, detail):
    path = path.format(ak=world["user"]["keypair"]["access_key"], me=world["dadmin"]["id"],
                       uid=world["user"]["id"])
    before = world["sa"].ok("GET", "/" + path.split("/")[0] + "/" + path.split("/", 1)[1]) \
        if method == "PATCH" else None
    r = _as_page(world, who, method, path, body)
    assert r.status_code == status, r.text
    assert r.json()["detail"] == detail, r.json()
    if before is not None:
        assert world["sa"].ok("GET", "/" + path) == before


def test_console_edits_and_deletes_each_kind(world):
    """Each kind the console lists, changed then deleted the way its controls do it, by
    the role that may (a domain admin in their domain; the superadmin for the rest)."""
    sa, hub = world["sa"], world["hub"]
    # A domain admin: a project (renamed, a member added and removed, deleted), a user
    # (edited, deleted), a keypair (rate limit, deleted).
    proj = _as_page(world, "dadmin", "POST", "projects",
                    {"name": "doomedproj", "domain_name": "default"}).json()
    r = _as_page(world, "dadmin", "PATCH", f"projects/{proj['id']}",
                 {"name": "renamedproj", "description": "soon gone", "is_active": False})
    assert r.status_code == 200 and r.json()["name"] == "renamedproj", r.text
    r = _as_page(world, "dadmin", "POST", f"projects/{proj['id']}/members",
                 {"user_ids": [world["monitor"]["id"]]})
    assert r.status_code == 200 and r.json()["added"] == ["pagemonitor"], r.text
    assert 'data-member="pagemonitor"' in _get(world, "dadmin", "admin/projects").text
    r = _as_page(world, "dadmin", "DELETE", f"projects/{proj['id']}/members/{world['monitor']['id']}")
    assert r.status_code == 204, r.text
    assert _as_page(world, "dadmin", "DELETE", f"projects/{proj['id']}").status_code == 204
    assert 'data-name="renamedproj"' not in _get(world, "dadmin", "admin/projects").text

    doomed = _as_page(world, "dadmin", "POST", "users", {
        "email": "doomed@example.com", "password": PASSWORD, "username": "doomed",
        "domain_name": "default"}).json()
    r = _as_page(world, "dadmin", "PATCH", f"users/{doomed['id']}",
                 {"full_name": "Doomed Person", "role": "monitor", "status": "inactive"})
    assert r.status_code == 200, r.text
    row = re.search(r'<tr data-username="doomed">(.*?)</tr>',
                    _get(world, "dadmin", "admin/users").text, re.S).group(1)
    assert "<td>monitor</td>" in row and "<td>inactive</td>" in row
    key = _as_page(world, "dadmin", "POST", "keypairs", {"user_id": doomed["id"]}).json()
    r = _as_page(world, "dadmin", "PATCH", f"keypairs/{key['access_key']}", {"rate_limit": 77})
    assert r.status_code == 200 and r.json()["rate_limit"] == 77, r.text
    assert _as_page(world, "dadmin", "DELETE", f"keypairs/{key['access_key']}").status_code == 204
    assert _as_page(world, "dadmin", "DELETE", f"users/{doomed['id']}").status_code == 204
    assert 'data-username="doomed"' not in _get(world, "dadmin", "admin/users").text

    # The superadmin: a domain, a policy of each kind, a resource group.
    sa.ok("POST", "/domains", json={"name": "doomeddom"})
    r = _as_page(world, "sa", "PATCH", "domains/doomeddom",
                 {"description": "temporary", "total_resource_slots": {"cpu": "8", "mem": "16 GiB"}})
    assert r.status_code == 200 and r.json()["total_resource_slots"] == {
        "cpu": "8", "mem": str(16 * 2**30)}, r.text
    page = world["hub"].login().get(hub.base + "/hub/backendai/admin/domains", timeout=60).text
    row = re.search(r'<tr data-name="doomeddom">(.*?)</tr>', page, re.S).group(1)
    assert "8 cores, 16 GiB memory" in row and 'value="16 GiB"' in row  # shown, and in the form
    assert _as_page(world, "sa", "DELETE", "domains/doomeddom").status_code == 204
    for kind, body in (("keypair", {"max_concurrent_sessions": 4}), ("user", {"max_vfolder_count": 5}),
                       ("project", {"max_quota_scope_size": 2**30})):
        sa.ok("POST", f"/{kind}-resource-policies", json={"name": f"doomed-{kind}"})
        r = _as_page(world, "sa", "PATCH", f"{kind}-resource-policies/doomed-{kind}", body)
        assert r.status_code == 200 and {k: r.json()[k] for k in body} == body, r.text
        r = _as_page(world, "sa", "DELETE", f"{kind}-resource-policies/doomed-{kind}")
        assert r.status_code == 204, r.text
    sa.ok("POST", "/resource-groups", json={"name": "doomedgroup"})
    r = _as_page(world, "sa", "PATCH", "resource-groups/doomedgroup",
                 {"is_public": True, "allowed_domains": ["default"], "scheduler": "lifo"})
    assert r.status_code == 200 and r.json()["allowed_domains"] == ["default"], r.text
    assert _as_page(world, "sa", "DELETE", "resource-groups/doomedgroup").status_code == 204
    text = world["hub"].login().get(hub.base + "/hub/backendai/admin/resource-groups", timeout=60).text
    assert 'data-name="doomedgroup"' not in text
