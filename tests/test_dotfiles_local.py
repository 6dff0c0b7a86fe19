"""Issue 27's dotfiles on the local backend (the Docker backend's are driven with the
official CLI in test_backendai_client_templates.py): a new session's kernel finds its
owner's and its domain's dotfiles in its working folder, with their permissions, the
user's winning for the same path; a user with container ids is refused in words."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Dotfile, User

from .inproc import DEAD, image_for, make_user, running_manager, wait_status


def test_dotfiles_reach_a_local_kernel(db_url, tmp_path):
    async def run():
        async with running_manager(db_url, tmp_path, "local") as mgr:
            user = await make_user(mgr)
            p = await mgr.ops.load_principal(username=user)
            await mgr.ops.dotfile_create(p, "user", ".bairc", "600", "mine\n")
            await mgr.ops.dotfile_create(p, "user", "conf/own.txt", "644", "own\n")

            def domain_files(s):
                u = s.scalars(select(User).where(User.username == user)).one()
                for path, data in ((".bairc", "the domain's\n"), ("domain.txt", "domain\n")):
                    s.add(Dotfile(owner=f"domain:{u.domain_name}", domain_name=u.domain_name,
                                  path=path, permission="644", data=data))

            await mgr.db(domain_files)
            sid = await mgr.enqueue(
                username=user, name="dots", image=image_for("local"),
                slots=ResourceSlot(cpu="0.5", mem=256 * 2**20), environ={}, service_prefix="/",
                session_type="batch",
                startup_command="cat .bairc conf/own.txt domain.txt; stat -c '%n %a' .bairc")
            sess = await wait_status(mgr, sid, DEAD)
            logs = sess.kernels[0].logs
            assert sess.status == "TERMINATED", (sess.status_info, logs)
            assert "mine\nown\ndomain\n.bairc 600\n" in logs, logs

            # container ids: one local user runs every kernel, so refused in words
            def ids(s):
                s.scalars(select(User).where(User.username == user)).one().container_uid = 2001

            await mgr.db(ids)
            sid = await mgr.enqueue(
                username=user, name="ids", image=image_for("local"),
                slots=ResourceSlot(cpu="0.5", mem=256 * 2**20), environ={},
                service_prefix="/", session_type="batch", startup_command="true")
            sess = await wait_status(mgr, sid, DEAD)
            assert sess.status == "ERROR" and "need the Docker backend" in sess.status_info, (
                sess.status_info)

    asyncio.run(run())
