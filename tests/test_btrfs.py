"""btrfs volumes (issue 26): the file system enforces the quotas.

A btrfs file system made by the test in its temporary directory (an image file,
``mkfs.btrfs``, a loop device, ``btrfs quota enable``; as root), removed afterwards
whatever happens. A real hub (subprocess, CHP, the Docker backend and the kernel image)
keeps its volume ``volume1`` there (``backend: btrfs``), so every folder, the users'
home folders included, is a subvolume and every quota scope a qgroup. Writes from a
kernel, through the admin API and through tus stop at the limit; a policy change
reaches a running session; a project's folders share its limit; a clone is a snapshot;
a folder's mount point does not stay in the home folder.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import threading
import uuid

import pytest
import requests

from jupyterhub_backendai.storageproxy.backends import make_volumes

from .api_world import Client, new_user, superadmin
from .btrfs_fs import btrfs_fs
from .btrfs_fs import run as _run
from .conftest import shutdown_hub
from .hub import Hub
from .kernel_client import execute
from .services import STORAGE_PROXY_BIN, free_port
from .test_backendai_client import BAI

MiB = 1 << 20


@pytest.fixture(scope="module")
def fs(tmp_path_factory):
    with btrfs_fs(str(tmp_path_factory.mktemp("btrfs")), 4 << 30) as mnt:
        yield mnt


@pytest.fixture(scope="module")
def hub(fs, tmp_path_factory, docker_image):
    d = tmp_path_factory.mktemp("btrfs-hub")
    volumes = {"volume1": {"backend": "btrfs", "path": os.path.join(fs, "volume1")}}
    hub = Hub(db_url=f"sqlite:///{d}/backendai.sqlite", backend="docker",
              extra_args=[f"--BackendAIManager.storage_volumes={json.dumps(volumes)}"]).start()
    yield hub
    shutdown_hub(hub)


@pytest.fixture(scope="module")
def volume(hub, fs):
    """The hub's volume as a second reader (qgroups and paths)."""
    return make_volumes({"volume1": {"backend": "btrfs", "path": os.path.join(fs, "volume1")}})[
        "volume1"]


def _policy(sa: Client, kind: str, limit: int) -> str:
    return sa.ok("POST", f"/{kind}-resource-policies",
                 json={"name": f"bt-{uuid.uuid4().hex[:6]}", "max_quota_scope_size": limit})["name"]


def _user(sa: Client, limit: int | None = None) -> tuple[dict, str | None]:
    u = new_user(sa)
    pol = None
    if limit is not None:
        pol = _policy(sa, "user", limit)
        sa.ok("PATCH", f"/users/{u['id']}", json={"resource_policy": pol})
    return u, pol


def _path(volume, f: dict) -> str:
    return volume.folder_path(f["quota_scope_id"], f["id"])


def _start(hub: Hub, u: dict, server: str, mounts: list[str] = ()) -> None:
    r = hub.spawn(u["username"], server, {"mounts": list(mounts)} if mounts else None,
                  token=u["token"])
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(u["username"], server, token=u["token"])


def _py(hub: Hub, u: dict, server: str, code: str) -> str:
    model = hub.server_model(u["username"], server, token=u["token"])
    return execute(hub.base, model["url"], u["token"], code).strip()


def _dd(hub, u, server, target: str, mib: int) -> str:
    """Write ``mib`` MiB of random bytes in the session's container as its user (``docker
    exec``: no Jupyter kernel to start, which itself writes in the home folder, on the
    same scope): "<exit code> <EDQUOT seen>"."""
    cid = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
         "--filter", f"label=ai.backend.owner={u['username']}"],
        capture_output=True, text=True, check=True).stdout.split()
    assert len(cid) == 1, cid
    r = subprocess.run(["docker", "exec", cid[0], "dd", "if=/dev/urandom", f"of={target}",
                        "bs=1M", f"count={mib}", "conv=fsync"], capture_output=True, text=True)
    return f"{r.returncode} {'Disk quota exceeded' in r.stderr}"


def test_a_volume_without_simple_quotas_is_refused_saying_so(tmp_path):
    with btrfs_fs(str(tmp_path), 256 * MiB, quota="full") as mnt:
        # Full accounting: a subvolume made inside a folder would escape its limit.
        with pytest.raises(ValueError, match="escapes the folder's limit"):
            make_volumes({"v": {"backend": "btrfs", "path": os.path.join(mnt, "v")}})
        assert make_volumes({"v": {"backend": "btrfs", "path": os.path.join(mnt, "v"),
                                   "allow_full_qgroups": True}})["v"].backend == "btrfs"
    with btrfs_fs(str(tmp_path), 256 * MiB, quota=None) as mnt:
        with pytest.raises(ValueError, match="quotas are not enabled"):
            make_volumes({"v": {"backend": "btrfs", "path": os.path.join(mnt, "v")}})
        conf = tmp_path / "storage.py"
        conf.write_text("c.StorageProxyApp.volumes = {'v': {'backend': 'btrfs', "
                        f"'path': {os.path.join(mnt, 'v')!r}}}}}\n")
        r = subprocess.run([STORAGE_PROXY_BIN, "--config", str(conf), "--port", str(free_port())],
                           env=dict(os.environ, BACKENDAI_STORAGE_TOKEN="t"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "quotas are not enabled" in r.stderr, r.stderr
    with pytest.raises(ValueError, match="not on a btrfs file system"):
        make_volumes({"v": {"backend": "btrfs", "path": str(tmp_path / "plain")}})


def test_a_kernel_stops_at_the_quota_and_a_policy_change_applies_at_once(hub, volume, fs):
    sa = superadmin(hub)
    u, pol = _user(sa, 64 * MiB)
    f = u["client"].ok("POST", "/vfolders", json={"name": "data1"})
    _start(hub, u, "q", ["data1"])
    # Past the scope's 64 MiB the kernel's own writes fail with EDQUOT.
    assert _dd(hub, u, "q", "/home/work/data1/big", 100) == "1 True"
    big = os.path.join(_path(volume, f), "big")
    assert _run("stat", "-f", "-c", "%T", big).strip() == "btrfs"  # on the volume
    assert os.stat(big).st_size <= 64 * MiB
    scope = volume.quota_scope(f["quota_scope_id"])
    assert scope["limit_bytes"] == 64 * MiB and scope["used_bytes"] <= 64 * MiB
    # A larger limit reaches the running session at once ...
    sa.ok("PATCH", f"/user-resource-policies/{pol}", json={"max_quota_scope_size": 256 * MiB})
    assert _dd(hub, u, "q", "/home/work/data1/more", 100) == "0 False"
    # ... and so does a smaller one.
    sa.ok("PATCH", f"/user-resource-policies/{pol}", json={"max_quota_scope_size": 8 * MiB})
    assert _dd(hub, u, "q", "/home/work/data1/none", 1) == "1 True"
    assert volume.quota_scope(f["quota_scope_id"])["limit_bytes"] == 8 * MiB
    hub.stop_server(u["username"], "q", token=u["token"])


# BTRFS_IOC_SUBVOL_CREATE = _IOW(0x94, 14, struct btrfs_ioctl_vol_args {s64 fd; char[4088]})
_NEST = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.ioctl(fd, 0x5000940E, bytearray(struct.pack("=q4088s", 0, sys.argv[2].encode())))
print("made")
"""


def test_a_subvolume_made_inside_a_folder_counts_against_its_scope(hub, volume):
    """The escape full accounting leaves: the session's user makes a btrfs subvolume
    inside a mounted folder (an ioctl any user may call on a directory they can write;
    no privilege, no btrfs tools) and writes there. Under simple quotas it joins the
    folder's scope by itself, so the write stops at the scope's limit like any other."""
    sa = superadmin(hub)
    u, _ = _user(sa, 32 * MiB)
    f = u["client"].ok("POST", "/vfolders", json={"name": "nest"})
    _start(hub, u, "n", ["nest"])
    cid = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=ai.backend.agent-id={hub.agent_id}",
         "--filter", f"label=ai.backend.owner={u['username']}"],
        capture_output=True, text=True, check=True).stdout.split()[0]
    r = subprocess.run(["docker", "exec", cid, "python3", "-c", _NEST, "/home/work/nest",
                        "inner"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "made", r.stderr
    inner = os.path.join(_path(volume, f), "inner")
    assert os.stat(inner).st_ino == 256  # a subvolume's root, made by the user
    assert _dd(hub, u, "n", "/home/work/nest/inner/big", 100) == "1 True"
    assert volume.quota_scope(f["quota_scope_id"])["used_bytes"] <= 32 * MiB
    hub.stop_server(u["username"], "n", token=u["token"])
    # Deleting the folder takes what the user nested in it (the subvolume delete alone
    # refuses a subvolume that holds another).
    volume.delete_folder(f["quota_scope_id"], f["id"])
    assert not os.path.exists(_path(volume, f))


def test_api_and_tus_uploads_stop_at_the_quota(hub, volume):
    sa = superadmin(hub)
    u, pol = _user(sa, 16 * MiB)
    c = u["client"]
    f = c.ok("POST", "/vfolders", json={"name": "up"})
    r = c("PUT", f"/vfolders/{f['id']}/upload", params={"path": "a.bin"},
          data=os.urandom(20 * MiB), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 413 and "quota" in r.json()["detail"], r.text
    assert os.listdir(_path(volume, f)) == []
    # tus: granted while it fitted, the scope filled meanwhile; the PATCH is refused,
    # nothing stays staged or in the folder.
    r = c("POST", f"/folders/{f['name']}/request-upload", json={"path": "t.bin", "size": 12 * MiB})
    assert r.status_code == 200, r.text
    url = f"{r.json()['url']}?token={r.json()['token']}"
    r = c("PUT", f"/vfolders/{f['id']}/upload", params={"path": "fill"}, data=os.urandom(8 * MiB),
          headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 201, r.text
    r = requests.patch(url, data=os.urandom(12 * MiB), timeout=60, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 413, r.text
    assert os.listdir(_path(volume, f)) == ["fill"]
    staging = os.path.join(volume.scope_path(f["quota_scope_id"]), ".tus")
    assert [n for n in os.listdir(staging) if not n.endswith(".done")] == []
    # What fits goes through tus (staged in the scope's subvolume, reflinked in).
    r = c("POST", f"/folders/{f['name']}/request-upload", json={"path": "ok.bin", "size": MiB})
    body = os.urandom(MiB)
    r = requests.patch(f"{r.json()['url']}?token={r.json()['token']}", data=body, timeout=60,
                       headers={"Tus-Resumable": "1.0.0", "Upload-Offset": "0",
                                "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 204, r.text
    with open(os.path.join(_path(volume, f), "ok.bin"), "rb") as fh:
        assert fh.read() == body
    # The file system's own refusal (EDQUOT) is the same 413: a folder whose qgroup is
    # limited below what the scope allows.
    sa.ok("PATCH", f"/user-resource-policies/{pol}", json={"max_quota_scope_size": 0})
    g = c.ok("POST", "/vfolders", json={"name": "small"})
    from jupyterhub_backendai.storageproxy.btrfs import subvolume_id

    sid = subvolume_id(_path(volume, g))
    _run("btrfs", "qgroup", "limit", str(2 * MiB), f"0/{sid}", volume.path)
    r = c("PUT", f"/vfolders/{g['id']}/upload", params={"path": "b.bin"},
          data=os.urandom(6 * MiB), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 413 and "quota exceeded" in r.json()["detail"], r.text
    assert os.listdir(_path(volume, g)) == []


def test_a_project_scope_is_shared_by_its_folders(hub, volume):
    sa = superadmin(hub)
    pol = _policy(sa, "project", 48 * MiB)
    [proj] = sa.ok("GET", "/projects", params={"name": "default"})["items"]
    before = proj.get("resource_policy")
    sa.ok("PATCH", f"/projects/{proj['id']}", json={"resource_policy": pol})
    try:
        u, _ = _user(sa)
        a = sa.ok("POST", "/vfolders", json={"name": f"pa-{uuid.uuid4().hex[:6]}",
                                             "project": "default"})
        b = sa.ok("POST", "/vfolders", json={"name": f"pb-{uuid.uuid4().hex[:6]}",
                                             "project": "default"})
        assert a["quota_scope_id"] == b["quota_scope_id"]
        _start(hub, u, "p", [a["name"], b["name"]])
        assert _dd(hub, u, "p", f"/home/work/{a['name']}/x", 30) == "0 False"
        # the second folder has only what the first left of the project's 48 MiB
        assert _dd(hub, u, "p", f"/home/work/{b['name']}/y", 30) == "1 True"
        assert volume.quota_scope(a["quota_scope_id"])["used_bytes"] <= 48 * MiB
        hub.stop_server(u["username"], "p", token=u["token"])
    finally:
        sa.ok("PATCH", f"/projects/{proj['id']}", json={"resource_policy": before})


def test_clone_of_a_1gib_folder_is_a_snapshot_through_the_api_and_the_official_cli(
        hub, volume, tmp_path):
    sa = superadmin(hub)
    u, _ = _user(sa)
    c = u["client"]
    f = c.ok("POST", "/vfolders", json={"name": "big"})
    src = _path(volume, f)
    subprocess.run(f"head -c 1G /dev/urandom > {src}/data && chown 1000:1000 {src}/data",
                   shell=True, check=True)
    subprocess.run(["sync", "-f", src], check=True)
    assert volume.folder_usage(f["quota_scope_id"], f["id"])["used_bytes"] >= 1 << 30
    copy = c.ok("POST", f"/vfolders/{f['id']}/clone", json={"name": "big-copy"})
    assert (copy["name"], copy["status"], copy["host"]) == ("big-copy", "ready", f["host"])
    dst = _path(volume, copy)
    # A snapshot of the source (its parent UUID), the same bytes, then independent.
    show = _run("btrfs", "subvolume", "show", dst)
    uuid_src = [ln.split()[-1] for ln in _run("btrfs", "subvolume", "show", src).splitlines()
                if ln.strip().startswith("UUID:")][0]
    assert f"Parent UUID: \t\t{uuid_src}" in show or uuid_src in show, show
    assert os.path.getsize(os.path.join(dst, "data")) == 1 << 30
    with open(os.path.join(src, "data"), "rb") as a, open(os.path.join(dst, "data"), "rb") as b:
        assert a.read(MiB) == b.read(MiB)
    with open(os.path.join(dst, "data"), "r+b") as b:
        b.write(b"changed")
    with open(os.path.join(src, "data"), "rb") as a:
        assert a.read(7) != b"changed"
    # Blocks shared: the user's scope holds about 1 GiB, not 2.
    assert volume.quota_scope(f["quota_scope_id"])["used_bytes"] < (1 << 30) + 64 * MiB
    # Backend.AI's own `vfolder clone` (23.09 client).
    bai = BAI(hub, u, str(tmp_path))
    out = bai("vfolder", "clone", "big", "big-cli", f["host"])
    assert "Cloning the vfolder is complete" in out, out
    [cli] = [x for x in c.ok("GET", "/vfolders", params={"name": "big-cli"})["items"]]
    assert os.path.getsize(os.path.join(_path(volume, cli), "data")) == 1 << 30
    # Bad input: 4xx, nothing made.
    r = c("POST", f"/vfolders/{f['id']}/clone", json={"name": "big-copy"})
    assert r.status_code == 409, r.text
    r = c("POST", f"/vfolders/{f['id']}/clone", json={"name": "../x"})
    assert r.status_code == 400, r.text
    names = sorted(x["name"] for x in c.ok("GET", "/vfolders")["items"]
                   if x["ownership_type"] == "user" and not x["name"].startswith("."))
    assert names == ["big", "big-cli", "big-copy"]
    # Deleting a folder deletes its subvolume.
    c.ok("DELETE", f"/vfolders/{copy['id']}")
    assert not os.path.exists(dst)


def test_a_mount_point_does_not_stay_in_the_home_folder(hub, volume):
    sa = superadmin(hub)
    u, _ = _user(sa)
    u["client"].ok("POST", "/vfolders", json={"name": "data1"})
    u["client"].ok("POST", "/vfolders", json={"name": "data2"})
    # A file written at ~/data2 while data2 is not mounted ...
    _start(hub, u, "m1")
    _py(hub, u, "m1", "import os; os.makedirs('/home/work/data2'); "
        "open('/home/work/data2/keep.txt', 'w').write('mine')")
    hub.stop_server(u["username"], "m1", token=u["token"])
    # ... a session that mounts both ...
    _start(hub, u, "m2", ["data1", "data2"])
    assert _py(hub, u, "m2", "import os; print(sorted(os.listdir('/home/work/data2')))") == "[]"
    hub.stop_server(u["username"], "m2", token=u["token"])
    # ... and a later session without them: no empty ~/data1, ~/data2/keep.txt as it was.
    _start(hub, u, "m3")
    assert _py(hub, u, "m3", (
        "import os; print(os.path.exists('/home/work/data1'), "
        "open('/home/work/data2/keep.txt').read())")) == "False mine"
    hub.stop_server(u["username"], "m3", token=u["token"])


def test_a_folders_own_limit_stops_a_kernel_the_api_and_tus_below_its_scope(hub, volume):
    """Backend.AI's per-folder max_size on btrfs: the folder's own qgroup ``0/<id>``
    carries it, so a kernel's writes stop there with EDQUOT while the scope has room;
    uploads through the API and tus past it are 413; a tus upload that fits is counted
    by the folder's qgroup (copied, not shared with the staging area); a clone keeps it."""
    sa = superadmin(hub)
    u, _ = _user(sa, 256 * MiB)
    c = u["client"]
    f = c.ok("POST", "/vfolders", json={"name": "lim", "max_size_bytes": 24 * MiB})
    other = c.ok("POST", "/vfolders", json={"name": "free"})
    sid = _run("btrfs", "inspect-internal", "rootid", _path(volume, f)).strip()
    qg = next(line.split() for line in _run("btrfs", "qgroup", "show", "--raw", "-re",
                                            volume.path).splitlines()
              if line.split()[:1] == [f"0/{sid}"])
    assert qg[3] == str(24 * MiB)  # max_rfer of the folder's own qgroup
    _start(hub, u, "l", ["lim", "free"])
    assert _dd(hub, u, "l", "/home/work/lim/big", 40) == "1 True"
    assert os.stat(os.path.join(_path(volume, f), "big")).st_size <= 24 * MiB
    # the scope still has room: the other folder takes more than the first one's limit
    assert _dd(hub, u, "l", "/home/work/free/big", 40) == "0 False"
    hub.stop_server(u["username"], "l", token=u["token"])
    listed = {x["name"]: x for x in c.ok("GET", "/vfolders")["items"]}
    assert listed["lim"]["max_size_bytes"] == 24 * MiB
    assert 20 * MiB < listed["lim"]["used_bytes"] <= 24 * MiB
    assert listed["free"]["used_bytes"] >= 40 * MiB
    # the API and tus past the folder's limit
    c.ok("DELETE", f"/vfolders/{f['id']}/files", params={"path": "big"})
    r = c("PUT", f"/vfolders/{f['id']}/upload", params={"path": "a.bin"},
          data=os.urandom(30 * MiB), headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 413, r.text
    assert os.listdir(_path(volume, f)) == []
    r = c("POST", "/folders/lim/request-upload", json={"path": "t.bin", "size": 30 * MiB})
    assert r.status_code == 413 and "lim" in r.json()["detail"], r.text
    # a tus upload that fits lands in the folder and its qgroup counts it
    body = os.urandom(10 * MiB)
    r = c("POST", "/folders/lim/request-upload", json={"path": "t.bin", "size": len(body)})
    url = f"{r.json()['url']}?token={r.json()['token']}"
    r = requests.patch(url, data=body, timeout=60, headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
        "Content-Type": "application/offset+octet-stream"})
    assert r.status_code == 204, r.text
    with open(os.path.join(_path(volume, f), "t.bin"), "rb") as fh:
        assert fh.read() == body
    assert volume.folder_quota(f["quota_scope_id"], f["id"])["used_bytes"] >= 10 * MiB
    # a clone keeps the limit on its own qgroup
    clone = c.ok("POST", f"/vfolders/{f['id']}/clone", json={"name": "lim2"})
    assert clone["max_size_bytes"] == 24 * MiB
    assert volume.folder_quota(clone["quota_scope_id"], clone["id"])["limit_bytes"] == 24 * MiB
    for x in (f, other, clone):
        c.ok("DELETE", f"/vfolders/{x['id']}")


def test_usage_reads_while_other_folders_come_and_go(hub, volume):
    """``btrfs qgroup show`` reads the quota tree in several searches and fails ("cannot
    find the qgroup") when a qgroup goes between them: a folder deleted, or one btrfs
    drops once a deleted subvolume is cleaned. A listing beside such a deletion once
    showed a folder's ``used_bytes`` as null; the read is now repeated. Here folders come
    and go on the hub's volume (a scope of their own, as another user's would) while a
    user's two folders are read, directly and through the API's listing."""
    sa = superadmin(hub)
    u, _ = _user(sa)
    c = u["client"]
    mine = [c.ok("POST", "/vfolders", json={"name": n}) for n in ("r1", "r2")]
    with open(os.path.join(_path(volume, mine[0]), "data"), "wb") as fh:
        fh.write(os.urandom(4 * MiB))
    scope = f"user:{uuid.uuid4().hex}"
    stop, deleted, errors = threading.Event(), [], []

    def churn():
        while not stop.is_set():
            fid = uuid.uuid4().hex
            volume.create_folder(scope, fid)
            with open(os.path.join(volume.folder_path(scope, fid), "x"), "wb") as fh:
                fh.write(os.urandom(MiB))
            volume.delete_folder(scope, fid)
            deleted.append(fid)

    def read(f):
        try:
            return volume.folder_usage(f["quota_scope_id"], f["id"])["used_bytes"]
        except Exception as e:  # what the API's listing used to turn into null
            errors.append(repr(e))

    churners = [threading.Thread(target=churn) for _ in range(2)]
    for t in churners:
        t.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for i in range(1500):
                used = list(pool.map(read, mine))
                assert not errors, errors
                assert used[0] >= 4 * MiB and used[1] is not None, used
                if i % 25 == 0:
                    listed = {x["name"]: x for x in c.ok("GET", "/vfolders")["items"]}
                    assert listed["r1"]["used_bytes"] >= 4 * MiB, listed["r1"]
                    assert listed["r2"]["used_bytes"] is not None, listed["r2"]
    finally:
        stop.set()
        for t in churners:
            t.join()
    assert len(deleted) > 100, len(deleted)  # the race was run, not missed
    for f in mine:
        c.ok("DELETE", f"/vfolders/{f['id']}")
