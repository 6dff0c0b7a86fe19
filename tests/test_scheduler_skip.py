"""A scheduler pass is skipped when nothing it depends on changed, and runs again
on every kind of change (SQLite and PostgreSQL): an arrival, a release, an agent
joining or lost, a policy or group option change, a time-based rule coming due."""

from __future__ import annotations

import datetime as dt

import pytest

from jupyterhub_backendai.common.types import AgentStatus
from jupyterhub_backendai.models import Agent, KeypairResourcePolicy
from jupyterhub_backendai.models.base import utcnow
from jupyterhub_backendai.scheduler import check_consistency, schedule_pass
from jupyterhub_backendai.scheduler.dispatcher import LAST_PASS

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
