"""A scheduler pass is skipped when nothing it depends on changed, and runs again
on every kind of change (SQLite and PostgreSQL): an arrival, a release, an agent
joining or lost, a policy or group option change, a time-based rule coming due."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid

import pytest
from sqlalchemy import text

from jupyterhub_backendai.common.types import AgentStatus
from jupyterhub_backendai.manager.scheduler import check_consistency, schedule_pass
from jupyterhub_backendai.manager.scheduler.dispatcher import LAST_PASS
from jupyterhub_backendai.models import Agent, KeypairResourcePolicy, Session
from jupyterhub_backendai.models.base import utcnow

from .scheduler_world import World, slots


@pytest.fixture
def w(sm) -> World:
    w = World(sm)
    w.agent("a1", cpu=2, mem="64g")
    w.user("alice")
    w.enqueue("alice", "fits", cpu=2)
    w.enqueue("alice", "waits", cpu=2)
    return w


def quiet(sm, now=None) -> bool:
    """Run a pass; True if it was skipped (and then it placed nothing)."""
    placed = schedule_pass(sm, "default", now=now)
    if LAST_PASS["skipped"]:
        assert placed == []
    return LAST_PASS["skipped"]


@contextlib.contextmanager
def engines_on(postgres, n: int):
    """``n`` sessionmakers, each on its own engine (as separate managers or clients),
    on a fresh PostgreSQL database with the default tenancy."""
    from jupyterhub_backendai.manager import tenancy
    from jupyterhub_backendai.models.db import make_engine, make_sessionmaker, upgrade

    url = postgres.new_database("t_" + uuid.uuid4().hex[:12])
    engines = [make_engine(url) for _ in range(n)]
    try:
        upgrade(engines[0])
        makers = [make_sessionmaker(e) for e in engines]
        with makers[-1].begin() as s:
            tenancy.ensure_defaults(s)
        yield makers
    finally:
        for e in engines:
            e.dispose()


def settle(w, sm, now=None) -> None:
    """Passes until one is skipped: the queue cannot move any more."""
    for _ in range(5):
        if quiet(sm, now):
            return
    raise AssertionError("the scheduler never settled")


def test_an_unchanged_queue_is_not_passed_again(w, sm):
    assert w.names(schedule_pass(sm, "default")) == ["fits"]
    assert LAST_PASS["skipped"] is False
    assert quiet(sm) is False  # after a pass that placed, the next one runs
    # ... over what the placing pass remembered, not the whole queue read again
    assert LAST_PASS["released_only"] is True
    assert quiet(sm) is True
    assert quiet(sm) is True
    assert w.status("waits") == "PENDING"
    assert w.info("waits").startswith("waiting for resources")
    assert schedule_pass(sm, "default", force=True) == []
    assert LAST_PASS["skipped"] is False


def test_a_release_wakes_the_queue(w, sm):
    settle(w, sm)
    w.finish("fits")
    assert w.names(schedule_pass(sm, "default")) == ["waits"]
    assert check_consistency(sm) == []


def test_an_arrival_is_looked_at(w, sm):
    settle(w, sm)
    w.agent("a2", cpu=1, mem="64g")
    settle(w, sm)
    w.enqueue("alice", "small", cpu=1)
    assert w.names(schedule_pass(sm, "default")) == ["small"]
    assert not LAST_PASS.get("arrivals_only")  # it fits: a full pass placed it


def test_only_the_arrivals_are_decided_when_only_sessions_arrived(w, sm):
    """The queue cannot move and sessions arrive that cannot be placed either: the pass
    reads and decides only them, against what the last pass knew, and gives each its
    own reason; then the loop is skipped again, and a release still moves the queue."""
    w.policy("tight", total=slots(cpu=1, mem="64g"))
    w.user("carol", policy="tight")
    settle(w, sm)
    w.enqueue("alice", "big", cpu=2)
    w.enqueue("alice", "huge", cpu=64)
    w.enqueue("carol", "over", cpu=2)
    assert schedule_pass(sm, "default") == []
    assert LAST_PASS["arrivals_only"] is True
    assert LAST_PASS["pending"] == 3  # the session that waited before was not read again
    assert w.info("big") == w.info("waits")
    assert w.info("big").startswith("waiting for resources: no agent has")
    assert w.info("huge").startswith("waiting for resources: no agent of the group is large")
    assert w.info("over").startswith("quota exceeded: your keypair's resource policy allows")
    assert quiet(sm) is True
    w.enqueue("carol", "over2", cpu=2)  # a second round on the same memory
    assert schedule_pass(sm, "default") == [] and LAST_PASS["arrivals_only"] is True
    assert w.info("over2") == w.info("over")
    w.finish("fits")
    assert w.names(schedule_pass(sm, "default")) == ["waits"]  # FIFO over old and new
    assert not LAST_PASS.get("arrivals_only")
    assert w.status("big") == "PENDING"
    assert check_consistency(sm) == []


def test_an_arrival_in_a_group_whose_queue_was_empty_is_placed(w, sm):
    """A pass over an empty queue reads no agents: an arrival there (while another
    group's queue keeps sessions PENDING) is decided on a full read, not on that."""
    w.agent("b1", group="other", cpu=4, mem="64g")
    w.enqueue("alice", "b-fits", cpu=2, group="other")
    settle(w, sm)
    for _ in range(3):
        schedule_pass(sm, "other")
    assert LAST_PASS["skipped"] is True
    w.enqueue("alice", "b-new", cpu=1, group="other")
    assert w.names(schedule_pass(sm, "other")) == ["b-new"]
    assert w.status("waits") == "PENDING"
    assert check_consistency(sm) == []


def test_an_arrival_with_another_change_or_committed_late_gets_a_full_pass(w, sm):
    settle(w, sm)
    w.enqueue("alice", "with_release", cpu=2)
    w.finish("fits")
    assert w.names(schedule_pass(sm, "default")) == ["waits"]
    assert not LAST_PASS.get("arrivals_only")
    settle(w, sm)
    # Created before the newest session the last pass saw, committed after it.
    w.enqueue("alice", "late", cpu=2, created_at=w.clock - dt.timedelta(seconds=1))
    assert schedule_pass(sm, "default") == []
    assert LAST_PASS["skipped"] is False and not LAST_PASS.get("arrivals_only")
    assert w.info("late").startswith("waiting for resources")


def test_an_arrival_to_cancel_gets_a_full_pass(w, sm):
    w.user("carol")
    w.group(is_public=False, allowed_keypairs=[w.keys["alice"]])
    settle(w, sm)
    w.enqueue("carol", "stranger", cpu=1)
    assert schedule_pass(sm, "default") == []
    assert LAST_PASS["skipped"] is False and not LAST_PASS.get("arrivals_only")
    assert w.status("stranger") == "CANCELLED"
    assert w.info("stranger").startswith("cancelled: resource group default is not allowed")
    assert w.status("waits") == "PENDING"
    assert check_consistency(sm) == []


def test_a_new_agent_and_a_lost_agent_count(w, sm):
    settle(w, sm)
    w.agent("a2", cpu=2, mem="64g")
    assert w.names(schedule_pass(sm, "default")) == ["waits"]
    w.enqueue("alice", "third", cpu=2)
    settle(w, sm)
    with sm.begin() as s:
        s.get(Agent, "a2").status = AgentStatus.LOST
    assert quiet(sm) is False
    with sm.begin() as s:
        a = s.get(Agent, "a2")
        a.status = AgentStatus.ALIVE
        a.available_slots = slots(cpu=4, mem="64g")
    assert w.names(schedule_pass(sm, "default")) == ["third"]


def test_a_policy_or_option_change_counts(w, sm):
    w.policy("one", max_concurrent_sessions=1)
    w.user("bob", policy="one")
    w.agent("a2", cpu=8, mem="64g")
    w.enqueue("bob", "b1")
    w.enqueue("bob", "b2")
    settle(w, sm)
    assert w.status("b2") == "PENDING"
    with sm.begin() as s:
        s.get(KeypairResourcePolicy, "one").max_concurrent_sessions = 2
    assert w.names(schedule_pass(sm, "default")) == ["b2"]
    settle(w, sm)
    w.group(scheduler_opts={"pending_timeout": 3600})
    assert quiet(sm) is False


def test_time_based_rules_still_fire_while_nothing_changes(w, sm):
    w.group(scheduler_opts={"pending_timeout": 60})
    t0 = utcnow()
    settle(w, sm, now=t0)
    assert quiet(sm, now=t0 + dt.timedelta(seconds=30)) is True
    schedule_pass(sm, "default", now=t0 + dt.timedelta(seconds=120))
    assert LAST_PASS["skipped"] is False
    assert w.status("waits") == "CANCELLED"
    assert check_consistency(sm) == []


# -- after a release: the remembered queue, fresh agents and usage ---------------------


@pytest.fixture
def full(sm) -> World:
    """One agent of 4 cores, full (r1, r2: 2 each); a queue behind it, oldest first:
    one too large for the free room a release leaves, one too large for any agent,
    and three that fit one by one."""
    return _full(World(sm), sm)


def _full(w: World, sm) -> World:
    w.agent("a1", cpu=4, mem="64g")
    w.user("alice")
    w.enqueue("alice", "r1", cpu=2)
    w.enqueue("alice", "r2", cpu=2)
    w.enqueue("alice", "big", cpu=4)
    w.enqueue("alice", "huge", cpu=64)
    w.enqueue("alice", "w1", cpu=2)
    w.enqueue("alice", "w2", cpu=1)
    w.enqueue("alice", "w3", cpu=2)
    assert w.names(schedule_pass(sm, "default")) == ["r1", "r2"]
    settle(w, sm)
    return w


def test_a_release_decides_the_remembered_queue_again(full, sm):
    w = full
    w.finish("r1")  # 2 cores free: "big" still waits, "w1" is next in FIFO order
    assert w.names(schedule_pass(sm, "default")) == ["w1"]
    assert LAST_PASS["released_only"] is True
    assert LAST_PASS["pending"] < 5  # "huge" (fits on no agent) was not decided again
    assert w.info("huge").startswith("waiting for resources: no agent of the group is large")
    assert w.info("w2").startswith("waiting for resources: no agent has")
    # What it placed was remembered with it; read after its own writes, that record
    # is checked once more (a pass over the remembered queue, not a full one).
    assert quiet(sm) is False and LAST_PASS["released_only"] is True
    assert quiet(sm) is True
    w.finish("r2")  # 2 cores free again: "w2" (1 core) first, then "w3" (2) no longer fits
    assert w.names(schedule_pass(sm, "default")) == ["w2"]
    assert LAST_PASS["released_only"] is True
    assert w.statuses()["w3"] == "PENDING" and w.statuses()["big"] == "PENDING"
    assert check_consistency(sm) == []
    # The same outcome as a full pass over the same record.
    infos = {n: w.info(n) for n in ("big", "huge", "w3")}
    assert schedule_pass(sm, "default", force=True) == []
    assert {n: w.info(n) for n in infos} == infos
    w.finish("w1")
    w.finish("w2")
    assert w.names(schedule_pass(sm, "default")) == ["big"]  # 4 free: the oldest first
    assert LAST_PASS["released_only"] is True
    assert check_consistency(sm) == []


def test_a_release_keeps_priority_and_lifo_order(full, sm):
    w = full
    w.enqueue("alice", "vip", cpu=2, priority=90)
    settle(w, sm)
    w.finish("r1")
    assert w.names(schedule_pass(sm, "default")) == ["vip"]  # ahead of the older w1
    assert LAST_PASS["released_only"] is True
    w.group(scheduler="lifo")
    settle(w, sm)  # a group change: a full pass, then quiet again
    w.finish("r2")
    assert w.names(schedule_pass(sm, "default")) == ["w3"]  # the newest that fits
    assert LAST_PASS["released_only"] is True
    assert check_consistency(sm) == []


def test_a_release_with_a_cancellation_or_a_new_priority_gets_a_full_pass(full, sm):
    w = full
    # A cancellation and an arrival created earlier: every PENDING aggregate as before.
    w.finish("w1", status="CANCELLED", result="FAILURE")
    w.enqueue("alice", "late", cpu=2, created_at=w.clock - dt.timedelta(seconds=10))
    w.finish("r1")
    assert w.names(schedule_pass(sm, "default")) == ["late"]
    assert not LAST_PASS.get("released_only")
    settle(w, sm)
    with sm.begin() as s:  # reprioritised while it waits: no aggregate sees it
        s.get(Session, w.ids["w3"]).priority = 90
    w.finish("r2")
    assert w.names(schedule_pass(sm, "default")) == ["w3"]
    assert not LAST_PASS.get("released_only")
    assert check_consistency(sm) == []


def test_a_cancellation_is_taken_out_of_the_remembered_queue(full, sm):
    """A session that leaves the queue (cancelled) costs a pass over the remembered
    queue without it, not a full pass; it is never placed, and the rest keeps its
    order. With an arrival beside it, the pass runs in full."""
    w = full
    w.finish("w1", status="CANCELLED", result="FAILURE")
    assert schedule_pass(sm, "default") == []
    assert LAST_PASS["released_only"] is True
    assert LAST_PASS["waiting"] == 4  # big, huge, w2, w3
    assert quiet(sm) is True
    w.finish("r1")  # 2 cores free: w1 would have been next; w2 (1 core) is
    assert w.names(schedule_pass(sm, "default")) == ["w2"]
    assert LAST_PASS["released_only"] is True
    assert w.status("w1") == "CANCELLED" and w.status("w3") == "PENDING"
    settle(w, sm)
    w.finish("w3", status="CANCELLED", result="FAILURE")
    w.enqueue("alice", "late", cpu=1, created_at=w.clock - dt.timedelta(seconds=10))
    w.enqueue("alice", "late2", cpu=1, created_at=w.clock - dt.timedelta(seconds=9))
    assert w.names(schedule_pass(sm, "default")) == ["late"]
    assert not LAST_PASS.get("released_only")
    assert check_consistency(sm) == []


def test_a_release_with_a_policy_change_gets_a_full_pass(full, sm):
    w = full
    w.policy("one", max_concurrent_sessions=1)
    w.user("bob", policy="one")
    w.enqueue("bob", "b1", cpu=1, priority=90)
    w.enqueue("bob", "b2", cpu=1, priority=90)
    w.agent("a2", cpu=2, mem="64g")
    assert w.names(schedule_pass(sm, "default")) == ["b1", "w2"]
    settle(w, sm)
    assert w.info("b2").endswith("max_concurrent_sessions)")
    w.finish("b1")  # a release: "b2", which waited on its limit, is decided again
    assert w.names(schedule_pass(sm, "default")) == ["b2"]
    assert LAST_PASS["released_only"] is True
    settle(w, sm)
    with sm.begin() as s:
        s.get(KeypairResourcePolicy, "one").max_concurrent_sessions = 5
    w.finish("r1")
    assert w.names(schedule_pass(sm, "default")) == ["w1"]
    assert not LAST_PASS.get("released_only")
    assert check_consistency(sm) == []


def test_a_release_keeps_the_starving_sessions_reservation(full, sm):
    w = full
    w.group(scheduler_opts={"starvation_threshold": 60})
    later = utcnow() + dt.timedelta(seconds=120)  # "big" (and all) waited past 60 s
    settle(w, sm, now=later)
    assert list(w.group_state()["reservations"]) == [w.ids["big"]]
    w.finish("r1")  # 2 free on the held agent: nothing else may take them
    assert schedule_pass(sm, "default", now=later) == []
    assert LAST_PASS["released_only"] is True
    assert w.info("w1").startswith("waiting for resources")
    assert "reserved agent(s) a1" in w.info("big")
    w.finish("r2")
    assert w.names(schedule_pass(sm, "default", now=later)) == ["big"]
    assert LAST_PASS["released_only"] is True
    assert check_consistency(sm) == []


def test_a_release_on_postgresql_with_a_row_being_cancelled_or_another_manager(postgres):
    """PostgreSQL, two managers (engines, each with its own memory) on one database: a
    session whose row another transaction holds (a cancellation under way) is neither
    placed nor written by the pass after a release (a full pass skips it, SKIP LOCKED);
    and what one manager placed after a release the other does not place again."""
    with engines_on(postgres, 3) as (a, b, other):
        w = _full(World(other), a)
        settle(w, b)
        with other.begin() as s:  # holds w1's row for the whole block
            s.get(Session, w.ids["w1"], with_for_update=True)
            w.finish("r1")
            assert w.names(schedule_pass(a, "default")) == ["w2"]
            assert not LAST_PASS.get("released_only")
        assert w.status("w1") == "PENDING"
        settle(w, a)
        settle(w, b)
        w.finish("r2")  # 3 cores free: "big" still waits, "w1" fits
        assert w.names(schedule_pass(b, "default")) == ["w1"]
        assert LAST_PASS["released_only"] is True
        # a's memory still holds w1, which left the queue placed by b (not cancelled:
        # on PostgreSQL, a full pass), and a places nothing again.
        assert schedule_pass(a, "default") == []
        assert not LAST_PASS.get("released_only") and LAST_PASS["skipped"] is False
        assert check_consistency(a) == []


def test_a_release_decides_sessions_waiting_for_it_again(full, sm):
    """Sessions that wait for another session are decided again when it ends: placed
    when it succeeded, cancelled when it failed (then the next pass runs in full)."""
    w = full
    w.enqueue("alice", "child", cpu=1, priority=90, deps=("r1",))
    w.enqueue("alice", "orphan", cpu=1, priority=90, deps=("r2",))
    settle(w, sm)
    assert w.info("child").startswith("waiting for")
    w.finish("r1")
    assert w.names(schedule_pass(sm, "default")) == ["child", "w2"]
    assert LAST_PASS["released_only"] is True
    settle(w, sm)
    w.finish("r2", status="ERROR", result="FAILURE")
    assert w.names(schedule_pass(sm, "default")) == ["w1"]
    assert LAST_PASS["released_only"] is True
    assert w.status("orphan") == "CANCELLED"
    assert quiet(sm) is False  # a pass that cancelled leaves nothing remembered
    assert check_consistency(sm) == []


def test_a_pass_that_placed_leaves_its_queue_remembered(full, sm):
    """After a full pass that placed sessions, the next pass decides the rest of the
    queue from that pass's memory (fresh agents and usage), with the verdicts a full
    pass would give, and then the loop is quiet."""
    w = full
    # An agent joins and a session arrives: the next pass runs in full.
    w.agent("a2", cpu=3, mem="64g")
    w.enqueue("alice", "w4", cpu=1)
    assert w.names(schedule_pass(sm, "default")) == ["w1", "w2"]
    assert not LAST_PASS.get("released_only") and LAST_PASS["skipped"] is False
    infos = {n: w.info(n) for n in ("big", "huge", "w3", "w4")}
    assert w.names(schedule_pass(sm, "default")) == []
    assert LAST_PASS["released_only"] is True
    assert LAST_PASS["waiting"] == 4
    assert {n: w.info(n) for n in infos} == infos
    assert quiet(sm) is True
    schedule_pass(sm, "default", force=True)
    assert {n: w.info(n) for n in infos} == infos  # the same as a full pass over it
    w.finish("r1")
    assert w.names(schedule_pass(sm, "default")) == ["w3"]
    assert LAST_PASS["released_only"] is True
    assert check_consistency(sm) == []


@pytest.mark.parametrize("path", ["full", "released"])
def test_a_policy_changed_while_a_placing_pass_runs_is_not_lost(postgres, monkeypatch, path):
    """PostgreSQL reads committed data statement by statement: a policy that changes
    while a pass places sessions is in the fingerprint that pass reads after its
    writes, though the pass decided on the old one. The next pass must not take that
    fingerprint on trust and skip: the new limit is applied at the next loop. (Arrivals,
    releases and cancellations in the group cannot commit then: the pass holds the
    group's row, its agents' and its queue's; the test below that shows it.) Here the
    policy is changed from another connection between the pass's decisions and its
    commit, in a full pass and in a pass over the remembered queue after a release."""
    from jupyterhub_backendai.manager.scheduler import dispatcher

    with engines_on(postgres, 2) as (sched, other):
        w = World(other)
        w.agent("a1", cpu=4, mem="64g")
        w.user("alice")
        w.policy("one", max_concurrent_sessions=1)
        w.user("bob", policy="one")
        w.enqueue("alice", "r1", cpu=2)
        w.enqueue("alice", "r2", cpu=2)
        assert w.names(schedule_pass(sched, "default")) == ["r1", "r2"]
        settle(w, sched)
        w.enqueue("alice", "w1", cpu=2)
        w.enqueue("bob", "b0", cpu=1)
        w.enqueue("bob", "b1", cpu=1)
        settle(w, sched)
        w.agent("a2", cpu=1, mem="64g")  # an agent joins and a session arrives:
        w.enqueue("alice", "w2", cpu=4)  # a full pass, which places b0 on a2
        if path == "released":
            assert w.names(schedule_pass(sched, "default")) == ["b0"]
            settle(w, sched)
            w.finish("r1")  # a release: the remembered queue, w1 placed on a1
        expect = ["b0"] if path == "full" else ["w1"]
        assert w.info("b1").endswith("max_concurrent_sessions)") or path == "full"

        real_commit = dispatcher.commit

        def commit_and_meanwhile(*args, **kw):
            real_commit(*args, **kw)
            monkeypatch.setattr(dispatcher, "commit", real_commit)
            with other.begin() as s:
                s.get(KeypairResourcePolicy, "one").max_concurrent_sessions = 2

        monkeypatch.setattr(dispatcher, "commit", commit_and_meanwhile)
        assert w.names(schedule_pass(sched, "default")) == expect
        assert bool(LAST_PASS.get("released_only")) == (path == "released")
        assert dispatcher.commit is real_commit  # the change was made inside that pass
        assert schedule_pass(sched, "default") == []  # no room left anywhere
        assert LAST_PASS["skipped"] is False
        # b1 no longer waits on bob's limit of one session, but for room.
        assert w.info("b1").startswith("waiting for resources")
        settle(w, sched)
        assert check_consistency(sched) == []


def test_an_arrival_in_the_group_waits_for_a_running_pass(postgres):
    """Why a pass needs no guard against arrivals in its own group committed while it
    runs: a new session's row refers to its resource group, whose row the pass holds
    (``FOR UPDATE``), so the insert waits on that lock until the pass has committed."""
    import threading
    import time

    from jupyterhub_backendai.manager.scheduler.snapshot import load_group

    with engines_on(postgres, 3) as (sched, other, watch):
        w = World(other)
        w.agent("a1", cpu=4, mem="64g")
        w.user("alice")
        arrival = threading.Thread(target=w.enqueue, args=("alice", "new"), kwargs={"cpu": 1})
        with sched.begin() as db:
            load_group(db, "default")  # as a pass does
            arrival.start()
            deadline = time.monotonic() + 30
            while True:
                with watch.begin() as s:
                    waiting = s.execute(text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock' AND query ILIKE 'INSERT INTO sessions%'"
                    )).scalar()
                if waiting:
                    break
                assert arrival.is_alive(), "the arrival was inserted while the pass held the group"
                assert time.monotonic() < deadline
                time.sleep(0.05)
        arrival.join(30)
        assert not arrival.is_alive()
        assert w.status("new") == "PENDING"


def test_wakes_of_the_scheduler_loop_between_sweeps_only_place(db_url, tmp_path, monkeypatch):
    """The loop's sweeps (liveness, the lifecycle's handlers: nine transactions) ran at
    every wake, four times in a rush of five starts. A wake within SWEEP_GAP of the last
    sweep now runs the passes only: an arrival is placed at once, without a sweep; once
    the gap has passed, a wake sweeps again. (schedule_interval is far off: no tick.)"""
    import asyncio

    from jupyterhub_backendai.common.slots import ResourceSlot
    from jupyterhub_backendai.manager import core

    from .inproc import make_user, running_manager

    monkeypatch.setattr(core, "SWEEP_GAP", 5.0)

    def no_tick(c):
        c.BackendAIManager.schedule_interval = 60.0

    async def run():
        async with running_manager(db_url, tmp_path, "local", slots={"cpu": 2, "mem": "2g"},
                                   configure=no_tick) as mgr:
            rounds: list[tuple[bool, list]] = []
            sweeps: list[bool] = []
            real_once, real_liveness = mgr.schedule_once, mgr.agents.check_liveness

            async def once(sweep=True):
                placed = await real_once(sweep=sweep)
                rounds.append((sweep, placed))
                return placed

            async def liveness():
                sweeps.append(True)
                return await real_liveness()

            mgr.schedule_once, mgr.agents.check_liveness = once, liveness

            async def next_round():
                n = len(rounds)
                async with asyncio.timeout(20):
                    while len(rounds) == n:
                        await asyncio.sleep(0.01)
                return rounds[-1]

            user = await make_user(mgr)
            monkeypatch.setattr(core, "SWEEP_GAP", 0.0)
            mgr.wake()
            assert (await next_round())[0] is True  # the gap has passed: a sweep
            # (a round the loop had begun before the wrappers may have swept too: only
            # what follows this sweep is counted; the loop runs one round at a time)
            sweeps.clear()
            monkeypatch.setattr(core, "SWEEP_GAP", 5.0)
            sid = await mgr.enqueue(  # wakes the loop
                username=user, name="arrival", image="local/python",
                slots=ResourceSlot(cpu=1, mem=256 * 2**20), environ={}, service_prefix="/",
                session_type="batch", startup_command="sleep 300")
            while sid not in (await next_round())[1]:
                pass
            assert all(sweep is False for sweep, _ in rounds[1:]), rounds
            assert sweeps == []
            monkeypatch.setattr(core, "SWEEP_GAP", 0.0)
            mgr.wake()
            assert (await next_round())[0] is True and len(sweeps) == 1
            await mgr.destroy_session(sid)

    asyncio.run(run())
