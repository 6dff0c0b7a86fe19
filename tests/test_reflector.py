"""The reflector (manager/reflector.py): JupyterHub's polls of every server answered by
one query, and a change seen by the next poll without waiting for the interval.

Real manager, real database (SQLite and PostgreSQL), real local-process kernels; the
queries are counted on the engine itself.
"""

from __future__ import annotations

import asyncio

import pytest
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


async def _running_session(mgr) -> tuple[str, str]:
    """A new user and a running batch session of theirs: (username, session id)."""
    user = await make_user(mgr)
    sid = await mgr.enqueue(
        username=user, name="s", image="local/python", slots=SLOTS, environ={},
        service_prefix="/", session_type="batch", startup_command="sleep 600")
    await wait_status(mgr, sid, {"RUNNING"})
    return user, sid


@pytest.mark.parametrize("when", ["as the read answers", "during the read"])
def test_a_poll_answered_while_its_server_stops_still_gets_its_state(db_url, tmp_path, when):
    """A spawner's stop forgets its session (``forget``) at any moment, also between the
    read that answers a poll and the poll's own turn. Before, that poll then raised
    ``KeyError``: the access watch of an open execute stream (``access_ended``) died of
    it when a deactivation stopped the user's server, and the stream stayed open (CI of
    stop 32's submission). The stop is made to land in that window: right as the read
    answers (after the read, before the poll's turn). A stop during the read must not leave the
    session kept (read again by every later read) either."""

    def configure(c):
        c.BackendAIManager.status_poll_interval = 3600
        c.Agent.slots = {"cpu": 4, "mem": "8g"}

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=configure) as mgr:
            user, sid = await _running_session(mgr)
            real_read = mgr.db_read
            stops = []

            async def read_then_stop(fn, *args, **kw):
                found = await real_read(fn, *args, **kw)
                if fn.__name__ == "session_states" and not stops:
                    stops.append(sid)
                    # The spawner's stop, in the window.
                    if when == "during the read":
                        mgr.reflector.forget(sid)
                    else:  # once the read's task is done, before its pollers run
                        asyncio.current_task().add_done_callback(
                            lambda _t: mgr.reflector.forget(sid))
                return found

            mgr.db_read = read_then_stop
            try:
                state = await mgr.reflector.state(sid)
            finally:
                del mgr.db_read
            assert stops == [sid], "the read did not run: the window was not reached"
            assert state is not None and state.status == "RUNNING", state
            # A forgotten session is not kept: it is read again when next polled, not by
            # every later read of other sessions.
            assert sid not in mgr.reflector._states
            await mgr.destroy_session(sid)
            await wait_status(mgr, sid, DEAD)
            assert (await mgr.reflector.state(sid)).dead

    asyncio.run(run())


def test_a_streams_access_watch_that_cannot_check_ends_the_stream(db_url, tmp_path,
                                                                  monkeypatch):
    """The access watch of an open stream (``access_ended``: execute and app streams)
    fails closed. A check that raises (here the session's state cannot be read) is
    retried; after ``ACCESS_UNCONFIRMED`` in a row the watch ends the stream with the
    reason, where before one such error ended the watch and left the stream open. One
    failed check between good ones ends nothing. The real manager, database and
    keypair lookups; only the state read is made to fail, as a fault."""
    from jupyterhub_backendai.api.compat import execute
    from jupyterhub_backendai.manager.access import load_principal

    monkeypatch.setattr(execute, "ACCESS_CHECK", 0.05)

    def configure(c):
        c.Agent.slots = {"cpu": 4, "mem": "8g"}

    async def run():
        async with running_manager(db_url, tmp_path, "local", configure=configure) as mgr:
            user, sid = await _running_session(mgr)
            p = await mgr.db(lambda s: load_principal(s, username=user))
            real_state = mgr.reflector.state
            faults = []  # True: that check's read fails

            async def state(s):
                if faults and faults.pop(0):
                    raise ConnectionError("the database is away (a fault of the test)")
                return await real_state(s)

            mgr.reflector.state = state
            try:
                # Failed, failed, fine, failed, fine...: never 3 in a row, so it holds.
                faults[:] = [True, True, False, True, False, False]
                watch = asyncio.ensure_future(execute.access_ended(mgr, p, sid))
                while faults:
                    assert not watch.done(), watch.result()
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)
                assert not watch.done(), watch.result()
                # Now every check fails: the watch ends it, saying why.
                faults[:] = [True] * 100
                why = await asyncio.wait_for(watch, 10)
                assert "could not confirm" in why and "ConnectionError" in why, why
            finally:
                del mgr.reflector.state
            # And the reasons it ends on are the access's own: the session ended.
            await mgr.destroy_session(sid)
            why = await asyncio.wait_for(execute.access_ended(mgr, p, sid), 30)
            assert why == "the session ended", why

    asyncio.run(run())
