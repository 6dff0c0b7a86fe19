"""The reflector (manager/reflector.py): JupyterHub's polls of every server answered by
one query, and a change seen by the next poll without waiting for the interval.

Real manager, real database (SQLite and PostgreSQL), real local-process kernels; the
queries are counted on the engine itself.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import event
from traitlets.config import Config

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager.core import BackendAIManager

from .inproc import DEAD, make_user, running_manager, wait_status

SLOTS = ResourceSlot(cpu="0.1", mem=64 * 2**20)


def _state_queries(mgr) -> list[str]:
    """Every query of a session's polled state, as the engine runs it."""
    seen: list[str] = []

    def before(conn, cursor, statement, params, context, executemany):
        if "LEFT OUTER JOIN kernels" in statement and "awaited_until" in statement:
            seen.append(statement)

    event.listen(mgr.engine, "before_cursor_execute", before)
    return seen


def test_polls_of_every_server_are_one_query_and_changes_are_seen_at_once(db_url, tmp_path):
    def configure(c):
        # The safety interval far away: what the test sees next comes from change events.
        c.BackendAIManager.status_poll_interval = 3600
        c.Agent.slots = {"cpu": 4, "mem": "8g"}

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=configure) as mgr:
            user = await make_user(mgr)
            sids = [await mgr.enqueue(
                username=user, name=f"s{i}", image="local/python", slots=SLOTS, environ={},
                service_prefix="/", session_type="batch", startup_command="sleep 600")
                for i in range(12)]
            for sid in sids:
                await wait_status(mgr, sid, {"RUNNING"})
            queries = _state_queries(mgr)

            # JupyterHub starting: every server polled at once -> one query.
            states = await asyncio.gather(*(mgr.reflector.state(sid) for sid in sids))
            assert [s.status for s in states] == ["RUNNING"] * 12
            assert len(queries) == 1, queries
            # Polled again within the interval, nothing changed: no query at all.
            again = await asyncio.gather(*(mgr.reflector.state(sid) for sid in sids))
            assert again == states and len(queries) == 1

            # One session ends: the next poll of it reads it again (the change event),
            # and that read also refreshes nothing else that is still fresh.
            await mgr.destroy_session(sids[0])
            ended = await mgr.reflector.state(sids[0])
            assert ended.status in DEAD and ended.dead, ended
            assert len(queries) == 2
            assert (await mgr.reflector.state(sids[1])).status == "RUNNING"
            assert len(queries) == 2

            # A session that does not exist polls as None (JupyterHub: the server is gone).
            assert await mgr.reflector.state("0" * 32) is None
            for sid in sids[1:]:
                await mgr.destroy_session(sid)
            for sid in sids[1:]:
                await wait_status(mgr, sid, DEAD)

    asyncio.run(run())


def test_another_managers_change_reaches_the_poll_through_the_bus(postgres, redis_server, tmp_path):
    """A change made by another hub (the session_changed broadcast on Redis) marks the
    polled state stale: the next poll reads it, though the interval is an hour."""
    db_url = postgres.new_database("t_reflect")
    bus = redis_server.fresh_url()

    def configure(c):
        c.BackendAIManager.status_poll_interval = 3600
        c.BackendAIManager.redis_url = bus

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=configure) as a:
            c = Config()
            c.BackendAIManager.db_url = db_url
            c.BackendAIManager.redis_url = bus
            c.BackendAIManager.embedded_agent = False
            c.BackendAIManager.status_poll_interval = 3600
            c.BackendAIManager.storage_volumes = a.test_config.BackendAIManager.storage_volumes
            b = BackendAIManager(config=c)
            await b.ready()
            b._loop_task.cancel()  # b only answers polls here (it cannot reach a's agent)
            try:
                user = await make_user(a)
                sid = await a.enqueue(
                    username=user, name="x", image="local/python", slots=SLOTS, environ={},
                    service_prefix="/", session_type="batch", startup_command="sleep 600")
                await wait_status(a, sid, {"RUNNING"})
                queries = _state_queries(b)
                assert (await b.reflector.state(sid)).status == "RUNNING"
                assert (await b.reflector.state(sid)).status == "RUNNING"
                assert len(queries) == 1  # the second poll: from memory
                await a.destroy_session(sid)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while not (await b.reflector.state(sid)).dead:
                    assert loop.time() < deadline, "b never saw a's change"
                    await asyncio.sleep(0.05)
            finally:
                await b.stop()

    asyncio.run(run())
