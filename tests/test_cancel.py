"""A cancel is never lost: JupyterHub stops a starting server by cancelling its
``start()`` and answers 500 when the start has not given up one second later.

Python 3.11's ``asyncio.wait_for`` drops a cancel that arrives in the loop turn in
which the awaited thing finishes; a session change at the moment of a DELETE did
exactly that to the spawner's watch (seen in CI: ``RuntimeError: admin:three pending
spawn`` after the quota it waited on was freed). The manager here is real, with a
real embedded agent (local processes) and SQLite.
"""

from __future__ import annotations

import asyncio
import sys

from jupyterhub_backendai.common.slots import ResourceSlot

from .inproc import image_for, make_user, running_manager


def _configure(c):
    # The watch re-reads on a timer too; a long one keeps it waiting on the change.
    c.BackendAIManager.status_poll_interval = 30
    c.Agent.local_cmd = [sys.executable, "-c", "import time; time.sleep(3600)"]


def test_a_watch_cancelled_as_its_session_changes_ends(tmp_path):
    async def main():
        async with running_manager(f"sqlite:///{tmp_path}/c.sqlite", tmp_path, "local",
                                   configure=_configure) as mgr:
            user = await make_user(mgr)
            sid = await mgr.enqueue(username=user, name="w", image=image_for("local"),
                                    slots=ResourceSlot(cpu="0.5", mem=512 * 2**20),
                                    environ={}, service_prefix="/")
            for attempt in range(5):
                seen = []
                waiting = asyncio.Event()

                async def watcher(seen=seen, waiting=waiting):
                    async for sess in mgr.watch(sid):
                        seen.append(sess.status)
                        if sess.status == "RUNNING":
                            waiting.set()

                task = asyncio.create_task(watcher())
                async with asyncio.timeout(60):
                    await waiting.wait()
                await asyncio.sleep(0.2)  # the watch now waits for the next change
                assert not task.done()
                mgr.events.changed(sid)  # a change and a cancel in one loop turn
                task.cancel()
                await asyncio.wait({task}, timeout=5)
                assert task.done() and task.cancelled(), \
                    f"attempt {attempt}: the watch went on after its cancel (seen {seen})"
                task.cancel()
            await mgr.destroy_session(sid)

    asyncio.run(main())
