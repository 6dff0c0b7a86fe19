"""The API's session lists from memory, kept current by changes (issue 11).

A plain user's ``GET /sessions`` is answered from an in-memory copy
(manager/session_lists.py). These tests set ``session_list_ttl`` to an hour, so that
every change seen below reached the list through an invalidation (a commit of this
process, its own change events, another manager's broadcast over a real Redis), never
through the copy's expiry; and they check that pages and filters from memory are the
database's answer exactly."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import update

from jupyterhub_backendai.common.session_request import SessionRequest
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager import access, admin
from jupyterhub_backendai.models import Session

from .inproc import make_user, running_manager, wait_status

SLOTS = ResourceSlot({"cpu": "0.1", "mem": 2**26})
HOUR = 3600.0


def _batch(cmd: str = "true") -> SessionRequest:
    return SessionRequest(image="local/python", slots=SLOTS, session_type="batch",
                          startup_command=cmd)


async def _principal(mgr, username):
    return await mgr.db_read(access.load_principal, username=username)


def _long_ttl(c):
    c.BackendAIManager.session_list_ttl = HOUR


def test_lists_come_from_memory_and_follow_every_change(tmp_path):
    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/l.sqlite", tmp_path, "local",
                                   configure=_long_ttl) as mgr:
            alice = await make_user(mgr)
            bob = await make_user(mgr, email="bob@example.com")
            pa = await _principal(mgr, alice)
            lists = mgr.session_lists
            first = await mgr.enqueue(_batch(), username=alice, name="one", environ={},
                                      service_prefix="/")
            await wait_status(mgr, first, {"TERMINATED"})
            page = await lists.page(pa, {}, 0, 50)
            loads = lists.loads
            assert [s["id"] for s in page["items"]] == [first]
            assert page["items"][0]["status"] == "TERMINATED"
            assert await lists.page(pa, {}, 0, 50) == page
            assert lists.loads == loads  # answered from memory

            # Another user's session: not in alice's list, before or after.
            await mgr.enqueue(_batch(), username=bob, name="bobs", environ={}, service_prefix="/")
            assert [s["id"] for s in (await lists.page(pa, {}, 0, 50))["items"]] == [first]

            # A new session of hers is listed at once, and follows its states.
            second = await mgr.enqueue(_batch("sleep 30"), username=alice, name="two",
                                       environ={}, service_prefix="/")
            page = await lists.page(pa, {}, 0, 50)
            assert [s["id"] for s in page["items"]] == [first, second]
            await wait_status(mgr, second, {"RUNNING"})
            assert (await lists.page(pa, {"status": "RUNNING"}, 0, 50))["total"] == 1
            await mgr.destroy_session(second, "TERMINATED", "stopped by the test")
            mine = {s["id"]: s for s in (await lists.page(pa, {}, 0, 50))["items"]}
            assert mine[second]["status"] == "TERMINATED"

            # A commit that announces nothing (an operator's fix through the ORM):
            # the commit itself drops the copy.
            def fix(s):
                s.get(Session, first).status_info = "fixed by hand"

            await mgr.db(fix)
            mine = {s["id"]: s for s in (await lists.page(pa, {}, 0, 50))["items"]}
            assert mine[first]["status_info"] == "fixed by hand"

            # Pages and filters from memory are the database's answer.
            third = await mgr.enqueue(_batch(), username=alice, name="three", environ={},
                                      service_prefix="/")
            await wait_status(mgr, third, {"TERMINATED"})
            for filters, offset, limit in [({}, 0, 50), ({}, 1, 1), ({}, 5, 10),
                                           ({"status": "TERMINATED"}, 0, 2),
                                           ({"type": "batch"}, 1, 50),
                                           ({"type": "interactive"}, 0, 50),
                                           ({"user_id": pa.user_id}, 0, 50),
                                           ({"user_id": "someone-else"}, 0, 50)]:
                want = await mgr.db_read(admin.list_sessions, pa, filters, offset, limit)
                assert await lists.page(pa, filters, offset, limit) == want, filters

    asyncio.run(run())


def test_another_managers_change_reaches_the_list_through_redis(redis_server, tmp_path):
    """Two managers on one database and one Redis bus: a change the second makes (and
    broadcasts) drops the first one's copy; nothing else would for an hour."""
    bus = redis_server.fresh_url()
    db = f"sqlite:///{tmp_path}/two.sqlite"

    def cluster(c):
        _long_ttl(c)
        c.BackendAIManager.redis_url = bus

    def no_agent(c):  # a second hub process of the cluster: no agent of its own
        cluster(c)
        c.BackendAIManager.embedded_agent = False

    async def run():
        async with running_manager(db, tmp_path / "a", "local", configure=cluster) as a:
            alice = await make_user(a, email=f"{uuid.uuid4().hex[:8]}@example.com")
            sid = await a.enqueue(_batch(), username=alice, name="one", environ={},
                                  service_prefix="/")
            await wait_status(a, sid, {"TERMINATED"})
            pa = await _principal(a, alice)
            before = (await a.session_lists.page(pa, {}, 0, 50))["items"][0]
            assert before["status_info"] != "changed elsewhere"
            loads = a.session_lists.loads

            async with running_manager(db, tmp_path / "b", "local", configure=no_agent) as b:
                def change(s):  # a Core statement: no ORM hook of a's sees it
                    s.execute(update(Session).where(Session.id == sid)
                              .values(status_info="changed elsewhere"))

                await b.db(change)
                assert (await a.session_lists.page(pa, {}, 0, 50))["items"][0] == before
                assert a.session_lists.loads == loads  # still a's copy: nothing announced
                b.changed(sid)  # b announces it, as its lifecycle does after every change

                async def seen():
                    items = (await a.session_lists.page(pa, {}, 0, 50))["items"]
                    return items[0]["status_info"] == "changed elsewhere"

                for _ in range(200):  # a bound for hangs; an hour without the broadcast
                    if await seen():
                        break
                    await asyncio.sleep(0.05)
                assert await seen()

    asyncio.run(run())
