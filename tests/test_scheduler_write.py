"""How a pass writes its decisions (scheduler/allocator.py), on SQLite and PostgreSQL.

Large passes on PostgreSQL write placements from a thread while they go on deciding
(``PlacementWriter``, in batches of ``allocator.STREAM_BATCH``); here the batch is 3
so that a small queue takes that path. Whatever the path: placed sessions and their
kernels say the same as before (status, reason, history in order, agent, slots), odd
characters survive the bulk statements, and a write that fails leaves nothing of the
pass behind.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, text

from jupyterhub_backendai.manager.lifecycle.record import set_status
from jupyterhub_backendai.manager.scheduler import allocator, check_consistency, schedule_pass
from jupyterhub_backendai.manager.scheduler.dispatcher import LAST_PASS
from jupyterhub_backendai.models import Kernel, Session

from .scheduler_world import World, slots

ODD_AGENT = 'odd "agent" \\ {a,b} \t tab'


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(allocator, "STREAM_BATCH", 3)


def world(sm) -> World:
    w = World(sm)
    w.agent("a1", cpu=8, mem="64g")
    w.agent("a2", cpu=8, mem="64g", gpu=2)
    w.agent(ODD_AGENT, cpu=4, mem="16g")
    w.policy("roomy", max_concurrent_sessions=100, max_containers_per_session=4)
    w.user("alice", policy="roomy")
    w.user("bob", policy="roomy")
    w.enqueue("bob", "odd", cpu=1, mem="1g", designated=[ODD_AGENT])
    for i in range(6):
        w.enqueue("alice", f"small{i}", cpu=1, mem="1g")
    w.enqueue("bob", "gpu", cpu=2, mem="4g", gpu=1)
    w.enqueue("bob", "multi", cpu=2, mem="2g", cluster_size=2, mode="multi-node")
    w.enqueue("alice", "huge", cpu=64, mem="1g")  # never fits: waits with a reason
    return w


def raw_history(sm, sid: str) -> str:
    with sm() as s:
        return s.execute(text("SELECT CAST(status_history AS TEXT) FROM sessions WHERE id = :i"),
                         {"i": sid}).scalar()


def test_placements_are_written_whole(sm, small_batches):
    w = world(sm)
    # A session that was scheduled before, failed to start and is back in the queue:
    # its history has SCHEDULED already (the new time replaces the old, in place).
    w.enqueue("alice", "again", cpu=1, mem="1g")
    with sm.begin() as s:
        sess = s.get(Session, w.ids["again"])
        set_status(sess, "SCHEDULED")
        set_status(sess, "PENDING", 'start failed (image "x\\y" missing); retry 1 of 2')
        old_scheduled = sess.status_history["SCHEDULED"]
    placed = w.names(schedule_pass(sm, "default", force=True))
    assert sorted(placed) == sorted(
        [f"small{i}" for i in range(6)] + ["gpu", "multi", "odd", "again"])
    if sm.kw["bind"].dialect.name == "postgresql":
        assert LAST_PASS["streamed_batches"] >= 3  # written while deciding
    else:
        assert LAST_PASS["streamed_batches"] == 0
    assert check_consistency(sm) == []

    for name in placed:
        sess = w.session(name)
        agents = sorted({k.agent_id for k in sess.kernels})
        assert sess.status == "SCHEDULED"
        assert sess.status_info == f"scheduled on {', '.join(agents)}"
        assert all(k.status == "SCHEDULED" for k in sess.kernels)
        assert all(k.occupied_slots == k.requested_slots.nonzero() for k in sess.kernels)
        history = json.loads(raw_history(sm, sess.id))
        assert list(history) == ["PENDING", "SCHEDULED"]
        assert history["SCHEDULED"] > history["PENDING"] or name == "again"
    assert w.agents_of("odd") == [ODD_AGENT]
    assert w.info("odd") == f"scheduled on {ODD_AGENT}"
    assert len(set(w.agents_of("multi"))) == 2
    assert w.agents_of("gpu") == ["a2"]
    assert w.session("again").status_history["SCHEDULED"] != old_scheduled

    assert w.status("huge") == "PENDING"
    assert w.info("huge").startswith("waiting for resources: no agent of the group is large enough")
    used = slots()
    for aid in ("a1", "a2", ODD_AGENT):
        used = used + w.occupied(aid)
    assert used == slots(cpu=6 + 2 + 4 + 1 + 1, mem=f"{6 + 4 + 4 + 1 + 1}g", gpu=1)


def test_a_failed_write_leaves_nothing_of_the_pass(sm, small_batches, monkeypatch):
    w = world(sm)
    before = w.statuses()
    calls = []
    real_pg, real_bulk = allocator._pg_update_unnest, allocator.bulk_update

    def fail_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the database went away")
        return real_pg(*a, **kw)

    def fail_agents(db, table, rows, key="id"):
        if table.name == "agents":
            raise RuntimeError("the database went away")
        return real_bulk(db, table, rows, key)

    # PostgreSQL: a batch written by the writer thread fails; SQLite: the final write.
    monkeypatch.setattr(allocator, "_pg_update_unnest", fail_second)
    monkeypatch.setattr(allocator, "bulk_update", fail_agents)
    with pytest.raises(RuntimeError, match="went away"):
        schedule_pass(sm, "default", force=True)
    assert w.statuses() == before
    with sm() as s:
        assert s.scalars(select(Kernel.agent_id).where(Kernel.agent_id.is_not(None))).all() == []
    for aid in ("a1", "a2", ODD_AGENT):
        assert w.occupied(aid) == slots()
    assert check_consistency(sm) == []

    monkeypatch.setattr(allocator, "_pg_update_unnest", real_pg)
    monkeypatch.setattr(allocator, "bulk_update", real_bulk)
    assert len(schedule_pass(sm, "default", force=True)) == 9
    assert check_consistency(sm) == []
