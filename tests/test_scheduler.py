"""Scheduler v0 against the real database: FIFO, slot check, one-transaction allocation."""

from __future__ import annotations

import threading
from decimal import Decimal

from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.manager import tenancy
from jupyterhub_backendai.models import Agent, Kernel, Session
from jupyterhub_backendai.scheduler.dispatcher import (
    check_consistency,
    release_kernels,
    schedule_pass,
    set_status,
)


def _setup(sm, agents: dict[str, dict]):
    with sm.begin() as s:
        user, kp, _ = tenancy.create_user(s, email="u@example.com", password="password1")
        for aid, cap in agents.items():
            s.add(Agent(id=aid, available_slots=ResourceSlot(cap), occupied_slots=ResourceSlot()))
        return user.id, kp.access_key


def _enqueue(sm, uid, ak, name, cpu, mem=2**30):
    with sm.begin() as s:
        slots = ResourceSlot(cpu=Decimal(str(cpu)), mem=mem)
        sess = Session(name=name, user_id=uid, access_key=ak, domain_name="default",
                       resource_group="default", image="img", requested_slots=slots)
        set_status(sess, "PENDING")
        sess.kernels.append(Kernel(requested_slots=slots))
        s.add(sess)
        s.flush()
        return sess.id


def _statuses(sm):
    with sm() as s:
        return {x.name: x.status for x in s.scalars(select(Session))}


def test_fifo_places_what_fits_and_skips_what_does_not(sm):
    uid, ak = _setup(sm, {"a1": {"cpu": 2, "mem": 8 * 2**30}})
    _enqueue(sm, uid, ak, "s1", 1)
    _enqueue(sm, uid, ak, "big", 4)
    _enqueue(sm, uid, ak, "s2", 1)
    _enqueue(sm, uid, ak, "s3", 1)
    placed = schedule_pass(sm, "default")
    assert len(placed) == 2
    assert _statuses(sm) == {"s1": "SCHEDULED", "big": "PENDING", "s2": "SCHEDULED", "s3": "PENDING"}
    with sm() as s:
        assert s.get(Agent, "a1").occupied_slots == {"cpu": 2, "mem": 2 * 2**30}
        big = s.scalar(select(Session).where(Session.name == "big"))
        assert "no agent has cpu=4" in big.status_info
    assert check_consistency(sm) == []


def test_release_frees_exactly_what_was_taken(sm):
    uid, ak = _setup(sm, {"a1": {"cpu": 1, "mem": 4 * 2**30}})
    sid = _enqueue(sm, uid, ak, "s1", "0.33")
    _enqueue(sm, uid, ak, "s2", "0.67")
    schedule_pass(sm, "default")
    with sm.begin() as s:
        sess = s.get(Session, sid)
        release_kernels(s, sess, "TERMINATED")
        set_status(sess, "TERMINATED")
        sess.alive_marker = None
    with sm() as s:
        assert s.get(Agent, "a1").occupied_slots == {"cpu": Decimal("0.67"), "mem": 2**30}
    assert check_consistency(sm) == []


def test_concentrated_packs_the_fullest_agent(sm):
    uid, ak = _setup(sm, {"a1": {"cpu": 4, "mem": 8 * 2**30}, "a2": {"cpu": 4, "mem": 8 * 2**30}})
    for i in range(4):
        _enqueue(sm, uid, ak, f"s{i}", 1)
    schedule_pass(sm, "default")
    with sm() as s:
        agents = {k.agent_id for k in s.scalars(select(Kernel))}
    assert len(agents) == 1


def test_two_schedulers_at_once_never_overcommit(sm):
    uid, ak = _setup(sm, {"a1": {"cpu": 3, "mem": 64 * 2**30}, "a2": {"cpu": 2, "mem": 64 * 2**30}})
    for i in range(40):
        _enqueue(sm, uid, ak, f"s{i}", 1)
    results: list[list[str]] = []
    barrier = threading.Barrier(4)

    def run():
        barrier.wait()
        for _ in range(3):
            results.append(schedule_pass(sm, "default"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    placed = [sid for r in results for sid in r]
    assert len(placed) == len(set(placed)) == 5
    with sm() as s:
        for a in s.scalars(select(Agent)):
            assert a.occupied_slots["cpu"] == a.available_slots["cpu"]
    assert check_consistency(sm) == []
