"""Vfolders mounted in sessions: what a kernel sees at /home/work/<name>, who may mount
what, and nothing left behind when a request is refused.

Driven through the manager in-process with a real agent (Docker containers of the
kernel image, or local processes) on SQLite and PostgreSQL. Folders are made as the
product makes them: a ``VFolder`` row and the directory on the storage's vfs volume
(a temporary one per test).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.common.errors import BackendAIError, InvalidRequest
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.common.types import VFolderStatus
from jupyterhub_backendai.manager import vfolders
from jupyterhub_backendai.manager.access import Principal
from jupyterhub_backendai.manager.vfolders import quota_scope_of_project, quota_scope_of_user
from jupyterhub_backendai.models import (
    Domain,
    Project,
    Session,
    User,
    VFolder,
    VFolderPermissionRow,
)
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker
from jupyterhub_backendai.storageproxy.volumes import VFSVolume

from .inproc import (
    DEAD,
    assert_nothing_left,
    image_for,
    leftovers,
    make_user,
    running_manager,
    wait_status,
)
from .services import StorageDaemon

HOST = "local:volume1"
SLOTS = ResourceSlot(cpu="0.5", mem=256 * 2**20)


async def make_folder(mgr, name: str, *, owner: str | None = None, project: str | None = None,
                      permission: str = "rw", share: dict | None = None,
                      host: str = HOST) -> tuple[str, str]:
    """A ready vfolder of user ``owner`` or of ``project`` (name), optionally shared
    ``{username: permission}``; returns (id, its directory on the volume)."""

    def work(s):
        if project is not None:
            proj = s.scalar(select(Project).where(Project.name == project))
            folder = VFolder(name=name, host=host, quota_scope_id=quota_scope_of_project(proj.id),
                             ownership_type="project", project_id=proj.id,
                             domain_name=proj.domain_name, permission=permission,
                             status=VFolderStatus.READY)
        else:
            user = s.scalar(select(User).where(User.username == owner))
            folder = VFolder(name=name, host=host, quota_scope_id=quota_scope_of_user(user.id),
                             ownership_type="user", user_id=user.id, domain_name=user.domain_name,
                             creator=user.email, permission=permission, status=VFolderStatus.READY)
        s.add(folder)
        s.flush()
        for username, perm in (share or {}).items():
            other = s.scalar(select(User).where(User.username == username))
            s.add(VFolderPermissionRow(vfolder_id=folder.id, user_id=other.id, permission=perm))
        return folder.id, folder.quota_scope_id

    fid, scope = await mgr.db(work)
    await mgr.storage.create_folder(host, scope, fid)
    return fid, await mgr.storage.mount_path(host, scope, fid)


def make_hub_folder(hub, username: str | None, name: str, project: str | None = None) -> tuple[str, str]:
    """A ready vfolder of ``username`` (or of ``project``, a name) in a running hub's
    record and on its storage volume (``hub.volume_path``); returns (id, path)."""
    engine = make_engine(hub.db_url)
    try:
        with make_sessionmaker(engine).begin() as s:
            if project is not None:
                proj = s.scalar(select(Project).where(Project.name == project))
                folder = VFolder(name=name, host=HOST, quota_scope_id=quota_scope_of_project(proj.id),
                                 ownership_type="project", project_id=proj.id,
                                 domain_name=proj.domain_name, permission="rw", status="ready")
            else:
                user = s.scalar(select(User).where(User.username == username))
                folder = VFolder(name=name, host=HOST, quota_scope_id=quota_scope_of_user(user.id),
                                 ownership_type="user", user_id=user.id, domain_name=user.domain_name,
                                 creator=user.email, permission="rw", status="ready")
            s.add(folder)
            s.flush()
            fid, scope = folder.id, folder.quota_scope_id
    finally:
        engine.dispose()
    volume = VFSVolume("volume1", hub.volume_path)
    volume.create_folder(scope, fid)
    return fid, volume.folder_path(scope, fid)


async def run_batch(mgr, backend: str, user: str, command: str, mounts, name: str, **kw):
    sid = await mgr.enqueue(
        username=user, name=name, image=image_for(backend), slots=SLOTS, environ={},
        service_prefix="/", session_type="batch", startup_command=command, mounts=mounts, **kw,
    )
    sess = await wait_status(mgr, sid, DEAD)
    return sess, await mgr.session_logs(sid)


async def session_count(mgr) -> int:
    return await mgr.db(lambda s: s.scalar(select(func.count()).select_from(Session)))


def _docker_mounts(container_id: str) -> list[dict]:
    out = subprocess.run(["docker", "inspect", "-f", "{{json .Mounts}}", container_id],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_rw_folder_written_in_session_appears_on_volume(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            alice = await make_user(mgr)
            fid, path = await make_folder(mgr, "data", owner=alice)
            sess, logs = await run_batch(
                mgr, backend, alice,
                "echo written-in-session > data/out.txt && id -u && pwd", [fid], "rw")
            assert (sess.status, sess.result) == ("TERMINATED", "SUCCESS"), (sess.status_info, logs)
            assert sess.vfolder_mounts == [{
                "id": fid, "name": "data", "host": HOST, "quota_scope_id": sess.vfolder_mounts[0][
                    "quota_scope_id"], "permission": "rw", "target": "/home/work/data"}]
            with open(os.path.join(path, "out.txt")) as f:
                assert f.read() == "written-in-session\n"
            if backend == "docker":
                # Written by the kernel's user (work, 1000), into a folder the storage
                # gave to that user.
                assert logs.split()[:2] == ["1000", "/home/work"], logs
                assert os.stat(os.path.join(path, "out.txt")).st_uid == 1000
            else:
                # The local backend's link is gone with the session's kernel.
                assert not os.path.lexists(os.path.join(mgr.agent.local_work_root, alice, "data"))
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_shared_ro_folder_readable_not_writable(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            alice = await make_user(mgr)
            bob = await make_user(mgr, "bob@example.com")
            fid, path = await make_folder(mgr, "notes", owner=bob, share={alice: "ro"})
            with open(os.path.join(path, "README"), "w") as f:
                f.write("bob's notes\n")
            sess, logs = await run_batch(
                mgr, backend, alice,
                "cat notes/README; if echo x > notes/new.txt; then echo WROTE; else echo DENIED; fi",
                ["notes"], "ro")
            assert sess.status == "TERMINATED", (sess.status_info, logs)
            assert sess.vfolder_mounts[0]["permission"] == "ro"
            assert "bob's notes" in logs
            if backend == "docker":
                assert "DENIED" in logs and "Read-only file system" in logs, logs
                assert not os.path.exists(os.path.join(path, "new.txt"))
            # The local backend cannot enforce ro (a link, one OS user): not asserted.
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_docker_bind_mounts_are_read_only_for_ro(db_url, docker_image, tmp_path):
    """The container's mounts as Docker reports them: rw and ro binds of the volume's folders."""

    async def run():
        async with running_manager(db_url, tmp_path, "docker") as mgr:
            alice = await make_user(mgr)
            bob = await make_user(mgr, "bob@example.com")
            own, own_path = await make_folder(mgr, "mine", owner=alice)
            shared, shared_path = await make_folder(mgr, "theirs", owner=bob, share={alice: "ro"})
            sid = await mgr.enqueue(
                username=alice, name="binds", image=docker_image, slots=SLOTS, environ={},
                service_prefix="/", session_type="batch", startup_command="sleep 300",
                mounts=["mine", shared],
            )
            sess = await wait_status(mgr, sid, ("RUNNING", *DEAD))
            assert sess.status == "RUNNING", sess.status_info
            binds = {m["Destination"]: (m["Type"], m["Source"], m["RW"])
                     for m in _docker_mounts(sess.kernels[0].container_id)}
            assert binds == {"/home/work/mine": ("bind", own_path, True),
                             "/home/work/theirs": ("bind", shared_path, False)}
            await mgr.destroy_session(sid)
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_two_users_see_the_same_project_folder(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            alice = await make_user(mgr)
            bob = await make_user(mgr, "bob@example.com")
            fid, path = await make_folder(mgr, "team", project="default")
            sess, logs = await run_batch(mgr, backend, alice, "echo from-alice > team/alice.txt",
                                         ["team"], "write")
            assert sess.status == "TERMINATED", (sess.status_info, logs)
            sess, logs = await run_batch(mgr, backend, bob, "cat team/alice.txt", ["team"], "read")
            assert sess.status == "TERMINATED", (sess.status_info, logs)
            assert "from-alice" in logs
            assert sess.vfolder_mounts[0]["id"] == fid
            assert os.listdir(path) == ["alice.txt"]
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_folders_the_user_may_not_mount_are_refused(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            alice = await make_user(mgr)
            carol = await make_user(mgr, "carol@example.com")
            private, _ = await make_folder(mgr, "secret", owner=carol)
            await make_folder(mgr, "mine", owner=alice)

            async def refused(mounts, reason: str):
                with pytest.raises(BackendAIError) as e:
                    await mgr.enqueue(
                        username=alice, name="refused", image=image_for(backend), slots=SLOTS,
                        environ={}, service_prefix="/", mounts=mounts)
                assert e.value.status_code == 400 and reason in e.value.detail, e.value.detail
                assert await session_count(mgr) == 0

            await refused([private], f"no vfolder {private!r} that you can mount")
            await refused(["secret"], "no vfolder 'secret' that you can mount")
            await refused(["mine", "mine"], "vfolder 'mine' is requested twice")
            await refused("mine", "mounts must be a list of vfolder names or ids")
            await refused([42], "mounts must be a list of vfolder names or ids")

            # The domain may keep folders on the host but not mount them in sessions.
            def no_mounting(s):
                s.get(Domain, "default").allowed_vfolder_hosts = {HOST: ["create-vfolder"]}

            await mgr.db(no_mounting)
            await refused(["mine"], f"you may not mount vfolders of host {HOST!r} in sessions")
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_every_kernel_of_a_multi_kernel_session_has_the_mount(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend) as mgr:
            alice = await make_user(mgr, max_containers=2)
            fid, path = await make_folder(mgr, "data", owner=alice)
            with open(os.path.join(path, "input.txt"), "w") as f:
                f.write("for every kernel\n")
            sid = await mgr.enqueue(
                username=alice, name="cluster", image=image_for(backend), slots=SLOTS,
                environ={}, service_prefix="/", session_type="batch", cluster_size=2,
                startup_command="cat data/input.txt; sleep 300", mounts=["data"])
            sess = await wait_status(mgr, sid, ("RUNNING", *DEAD))
            assert sess.status == "RUNNING", sess.status_info
            main, sub = sess.kernels
            if backend == "docker":
                for k in (main, sub):
                    seen = subprocess.run(
                        ["docker", "exec", k.container_id, "cat", "/home/work/data/input.txt"],
                        capture_output=True, text=True)
                    assert seen.stdout == "for every kernel\n", (k.cluster_hostname, seen.stderr)
            else:
                # Both kernels' processes work in alice's folder, where the link is.
                link = os.path.join(mgr.agent.local_work_root, alice, "data")
                for k in (main, sub):
                    assert os.readlink(f"/proc/{k.container_id}/cwd") == os.path.dirname(link)
                assert os.path.realpath(link) == path
            await mgr.destroy_session(sid)
            if backend == "local":
                assert not os.path.lexists(link)
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_a_folder_deleted_before_the_start_fails_it(db_url, backend, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, backend, retries=0) as mgr:
            alice = await make_user(mgr)
            fid, _ = await make_folder(mgr, "data", owner=alice)
            # Queued now, placed later: the folder goes in between.
            sid = await mgr.enqueue(
                username=alice, name="late", image=image_for(backend), slots=SLOTS, environ={},
                service_prefix="/", mounts=["data"],
                starts_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1))
            await mgr.db(lambda s: s.delete(s.get(VFolder, fid)))
            sess = await wait_status(mgr, sid, DEAD)
            assert (sess.status, sess.status_info) == (
                "ERROR", "failed to start: vfolder 'data' was deleted")
            assert leftovers(mgr.agent) == []
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_check_mounts_matches_enqueue(db_url, tmp_path):
    """What the spawner asks before creating anything: the same resolution as enqueue."""

    async def run():
        async with running_manager(db_url, tmp_path, "local") as mgr:
            alice = await make_user(mgr)
            fid, _ = await make_folder(mgr, "mine", owner=alice)
            pid, _ = await make_folder(mgr, "team", project="default", permission="ro")
            listed = await mgr.mountable_folders(alice)
            assert listed == [
                {"id": fid, "name": "mine", "owner": alice, "permission": "rw", "project": None},
                {"id": pid, "name": "team", "owner": "project default", "permission": "ro",
                 "project": "default"},
            ]
            got = await mgr.check_mounts(alice, None, ["team", fid])
            assert [(m["name"], m["permission"], m["target"]) for m in got] == [
                ("team", "ro", "/home/work/team"), ("mine", "rw", "/home/work/mine")]
            with pytest.raises(InvalidRequest, match="no vfolder 'nope'"):
                await mgr.check_mounts(alice, None, ["nope"])

    asyncio.run(run())


def test_spawner_form_and_api_mount_folders(make_hub, db_url):
    """Through a real hub: the form lists the user's folders as checkboxes, a bad
    ``mounts`` option is a 400 with nothing created, ticked folders are mounted."""
    hub = make_hub(db_url=db_url, backend="local")
    notes, notes_path = make_hub_folder(hub, "admin", "notes")
    data, _ = make_hub_folder(hub, "admin", "data")
    engine = make_engine(hub.db_url)
    with make_sessionmaker(engine).begin() as db:  # admin in a second project, which has a folder
        other = Project(name="other", domain_name="default")
        db.add(other)
        admin = db.scalar(select(User).where(User.username == "admin"))
        admin.projects.append(other)
    team, _ = make_hub_folder(hub, None, "team", project="other")
    s = hub.login()
    form = s.get(hub.base + "/hub/spawn").text
    for fid in (notes, data, team):
        assert f'type="checkbox" name="mounts" value="{fid}"' in form, form
    # A project's folders show only while that project is chosen.
    assert '<div class="form-check" data-project="other">' in form, form
    assert 'team <span class="text-muted small">(project other, read-write)</span>' in form

    for options, reason in [
        ({"mounts": ["nope"]}, "no vfolder 'nope' that you can mount"),
        ({"mounts": "notes"}, "mounts must be a list of vfolder names or ids"),
        ({"mounts": ["notes", notes]}, "vfolder 'notes' is requested twice"),
        ({"mounts": ["team"], "project": "default"},
         "no vfolder 'team' that you can mount in project 'default'"),
    ]:
        r = hub.spawn("admin", "bad", options)
        assert r.status_code == 400 and reason in r.json()["message"], (options, r.text)
    try:
        with make_sessionmaker(engine)() as db:
            assert db.scalar(select(func.count()).select_from(Session)) == 0

        # The form posts one "mounts" value per ticked box.
        r = s.post(hub.base + "/hub/spawn/admin/withmounts",
                   data={"image": hub.image, "cpu": "0.5", "mem": "256m", "project": "other",
                         "mounts": [notes, data, team], "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
        assert r.status_code == 200, r.text[-2000:]
        hub.wait_ready("admin", "withmounts")
        with make_sessionmaker(engine)() as db:
            sess = db.scalar(select(Session).where(Session.name == "withmounts"))
            # The user's home folder first (made at this first start), then the ticked ones.
            assert [(m["name"], m["target"]) for m in sess.vfolder_mounts] == [
                (".home", "/home/work"), ("notes", "/home/work/notes"),
                ("data", "/home/work/data"), ("team", "/home/work/team")]
            h = sess.vfolder_mounts[0]
        # The local backend's working folder is the home folder; the others are links in it.
        home = os.path.join(hub.volume_path, *h["quota_scope_id"].split(":"), h["id"])
        assert os.path.realpath(os.path.join(home, "notes")) == notes_path
        hub.stop_server("admin", "withmounts")
        assert not os.path.lexists(os.path.join(home, "notes"))
    finally:
        engine.dispose()


def test_the_permission_at_start_decides(db_url, docker_image, tmp_path):
    """Between enqueue and start: a share narrowed to ro mounts read-only, a share
    withdrawn fails the start with the reason."""

    async def run():
        async with running_manager(db_url, tmp_path, "docker", retries=0) as mgr:
            alice = await make_user(mgr)
            bob = await make_user(mgr, "bob@example.com")
            narrowed, _ = await make_folder(mgr, "narrowed", owner=bob, share={alice: "rw"})
            withdrawn, _ = await make_folder(mgr, "withdrawn", owner=bob, share={alice: "rw"})
            later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)
            ro_sid = await mgr.enqueue(
                username=alice, name="narrowed", image=docker_image, slots=SLOTS, environ={},
                service_prefix="/", session_type="batch", startup_command="sleep 300",
                mounts=["narrowed"], starts_at=later)
            gone_sid = await mgr.enqueue(
                username=alice, name="withdrawn", image=docker_image, slots=SLOTS, environ={},
                service_prefix="/", session_type="batch", startup_command="sleep 300",
                mounts=["withdrawn"], starts_at=later)

            def change(s):
                alice_id = s.scalar(select(User.id).where(User.username == alice))
                s.get(VFolderPermissionRow, (narrowed, alice_id)).permission = "ro"
                s.delete(s.get(VFolderPermissionRow, (withdrawn, alice_id)))

            await mgr.db(change)
            sess = await wait_status(mgr, ro_sid, ("RUNNING", *DEAD))
            assert sess.status == "RUNNING", sess.status_info
            (mount,) = _docker_mounts(sess.kernels[0].container_id)
            assert (mount["Destination"], mount["RW"]) == ("/home/work/narrowed", False)
            sess = await wait_status(mgr, gone_sid, DEAD)
            assert (sess.status, sess.status_info) == (
                "ERROR", "failed to start: vfolder 'withdrawn' may no longer be mounted by its user")
            await mgr.destroy_session(ro_sid)
            await assert_nothing_left(mgr)

    asyncio.run(run())


def test_a_folder_on_a_storage_proxy_daemon(db_url, backend, tmp_path):
    """A folder of a ``backendai-storage-proxy`` daemon (HTTP, its own volume): made
    through it, mounted and written in a session; with the daemon gone, a start fails
    with the reason and leaves nothing."""

    async def run():
        (tmp_path / "storage").mkdir()
        daemon = StorageDaemon(tmp_path / "storage")
        daemon.start()

        def configure(c):
            c.BackendAIManager.storage_proxies = {"remote": {"url": daemon.url, "token": daemon.token}}

        try:
            async with running_manager(db_url, tmp_path, backend, retries=0,
                                       configure=configure) as mgr:
                alice = await make_user(mgr)

                def allow(s):
                    d = s.get(Domain, "default")
                    d.allowed_vfolder_hosts = {**d.allowed_vfolder_hosts,
                                               "remote:volume1": ["mount-in-session"]}

                await mgr.db(allow)
                fid, path = await make_folder(mgr, "far", owner=alice, host="remote:volume1")
                assert path.startswith(daemon.volumes["volume1"]["path"] + os.sep)
                sess, logs = await run_batch(mgr, backend, alice, "echo over-http > far/out.txt",
                                             ["far"], "remote")
                assert sess.status == "TERMINATED", (sess.status_info, logs)
                with open(os.path.join(path, "out.txt")) as f:
                    assert f.read() == "over-http\n"

                daemon.stop()
                # A new folder there: the proxy is away, not the host unknown; no row stays.
                row = await mgr.db_read(lambda s: s.scalar(select(User).where(
                    User.username == alice)))
                who = Principal(user_id=row.id, username=row.username, email=row.email,
                                role=row.role, domain=row.domain_name)
                with pytest.raises(BackendAIError) as e:
                    await vfolders.create(mgr, who, {"name": "later", "host": "remote:volume1"})
                assert e.value.status_code == 503
                assert e.value.detail.startswith(
                    "host: the storage proxy 'remote' of 'remote:volume1' does not answer ("), \
                    e.value.detail
                assert not await mgr.db_read(lambda s: s.scalar(
                    select(func.count()).select_from(VFolder).where(VFolder.name == "later")))
                sess, _ = await run_batch(mgr, backend, alice, "true", ["far"], "unreachable")
                assert sess.status == "ERROR"
                assert sess.status_info.startswith(
                    f"failed to start: vfolder 'far' on remote:volume1 is unreachable: "
                    f"storage proxy at {daemon.url} failed"), sess.status_info
                await assert_nothing_left(mgr)
        finally:
            daemon.stop()

    asyncio.run(run())
