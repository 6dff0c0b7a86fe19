"""The scheduler pipeline against the real database (SQLite and PostgreSQL): one behaviour each.

Sequencers, validators, selectors, multi-kernel placement, head-of-line and
starvation guards, admission at enqueue, the consistency check, metrics.
"""

from __future__ import annotations

import datetime as dt
import threading
from decimal import Decimal

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from jupyterhub_backendai.common.errors import Forbidden, QuotaExceeded
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.common.times import parse_utc
from jupyterhub_backendai.manager.lifecycle.record import set_status
from jupyterhub_backendai.manager.scheduler import (
    admit,
    check_consistency,
    schedule_pass,
    scheduler_stats,
)
from jupyterhub_backendai.models import (
    Agent,
    Domain,
    Kernel,
    KeypairResourcePolicy,
    Project,
    Session,
)
from jupyterhub_backendai.models.base import utcnow

from .scheduler_world import GiB, World, slots


@pytest.fixture
def w(sm) -> World:
    return World(sm)


def one_user(w: World, policy: str = "default") -> str:
    w.user("alice", policy=policy)
    return "alice"


# -- sequencers -------------------------------------------------------------------


def test_fifo_orders_by_priority_band_then_age(w, sm):
    w.agent("a1", cpu=2, mem="64g")
    one_user(w)
    w.enqueue("alice", "old")
    w.enqueue("alice", "new")
    w.enqueue("alice", "urgent", priority=90)
    assert w.names(schedule_pass(sm, "default")) == ["urgent", "old"]
    assert w.status("new") == "PENDING"


def test_lifo_takes_the_newest_of_the_band_first(w, sm):
    w.group(scheduler="lifo")
    w.agent("a1", cpu=2, mem="64g")
    one_user(w)
    for n in ("s1", "s2", "s3"):
        w.enqueue("alice", n)
    w.enqueue("alice", "low", priority=10)
    assert w.names(schedule_pass(sm, "default")) == ["s3", "s2"]


def test_drf_equalises_dominant_shares(w, sm):
    # The DRF paper's example: 9 CPUs, 18 GB; A runs <1 CPU, 4 GB>, B runs <3 CPU, 1 GB>.
    w.group(scheduler="drf")
    w.agent("a1", cpu=9, mem="18g")
    w.user("a")
    w.user("b")
    for i in range(5):
        w.enqueue("a", f"a{i}", cpu=1, mem="4g")
    for i in range(5):
        w.enqueue("b", f"b{i}", cpu=3, mem="1g")
    placed = w.names(schedule_pass(sm, "default"))
    assert sorted(placed) == ["a0", "a1", "a2", "b0", "b1"]  # both at a dominant share of 2/3
    assert w.occupied("a1") == {"cpu": 9, "mem": 14 * GiB}


def test_drf_counts_what_users_already_run(w, sm):
    w.group(scheduler="drf")
    w.agent("a1", cpu=4, mem="64g")
    w.user("a")
    w.user("b")
    w.enqueue("a", "a-running", cpu=2)
    schedule_pass(sm, "default")
    w.enqueue("a", "a-next", cpu=1)
    w.enqueue("b", "b-next", cpu=1)
    w.enqueue("b", "b-more", cpu=1)
    # b holds nothing, so b goes first twice: shares a 2/4 vs b 0 -> 1/4 -> 2/4.
    assert w.names(schedule_pass(sm, "default")) == ["b-next", "b-more"]


def test_priority_is_capped_by_the_keypair_policy(w, sm):
    w.policy("capped", max_priority=40)
    w.agent("a1", cpu=1, mem="64g")
    w.user("modest")
    w.user("pushy", policy="capped")
    w.enqueue("modest", "m", priority=50)
    w.enqueue("pushy", "p", priority=90)  # stored 90 (set before the cap), counts as 40
    assert w.names(schedule_pass(sm, "default")) == ["m"]


# -- validators -------------------------------------------------------------------


def test_keypair_max_concurrent_sessions(w, sm):
    w.policy("two", max_concurrent_sessions=2)
    w.agent("a1", cpu=8, mem="64g")
    one_user(w, "two")
    for n in ("s1", "s2", "s3"):
        w.enqueue("alice", n)
    assert len(schedule_pass(sm, "default")) == 2
    assert w.info("s3") == (
        "quota exceeded: your keypair's resource policy allows 2 sessions at a time and 2 are "
        "already running or starting; this one waits until one ends "
        "(keypair policy 'two', max_concurrent_sessions)"
    )
    w.finish("s1")
    assert w.names(schedule_pass(sm, "default")) == ["s3"]


def test_keypair_total_resource_slots(w, sm):
    w.policy("small", total=slots(cpu=2))
    w.agent("a1", cpu=8, mem="64g")
    one_user(w, "small")
    for n in ("s1", "s2", "s3"):
        w.enqueue("alice", n, cpu=1)
    assert len(schedule_pass(sm, "default")) == 2
    assert w.info("s3") == (
        "quota exceeded: your keypair's resource policy allows 2 cores in total; 2 cores are in "
        "use and this session asks for 1 more (keypair policy 'small', total_resource_slots)"
    )


@pytest.mark.parametrize("default_for_unspecified, placed", [("UNLIMITED", 1), ("LIMITED", 0)])
def test_default_for_unspecified_decides_missing_slots(w, sm, default_for_unspecified, placed):
    w.policy("p", total=slots(cpu=4, mem="16g"), default_for_unspecified=default_for_unspecified)
    w.agent("a1", cpu=8, mem="64g", gpu=2)
    one_user(w, "p")
    w.enqueue("alice", "gpu", cpu=1, gpu=1)
    assert len(schedule_pass(sm, "default")) == placed
    if not placed:
        assert w.info("gpu") == (
            "quota exceeded: your keypair's resource policy allows 0 GPUs in total; 0 GPUs are "
            "in use and this session asks for 1 more (keypair policy 'p', total_resource_slots)"
        )


def test_user_quota_spans_keypairs_at_the_tightest_policy(w, sm):
    w.policy("three", total=slots(cpu=3))
    w.policy("two", total=slots(cpu=2))
    w.agent("a1", cpu=8, mem="64g")
    w.user("alice", policy="three")
    second = w.keypair("alice", policy="two")
    w.enqueue("alice", "k1")
    w.enqueue("alice", "k2", access_key=second)
    w.enqueue("alice", "k1-again")
    assert w.names(schedule_pass(sm, "default")) == ["k1", "k2"]
    assert w.info("k1-again") == (
        "quota exceeded: all your sessions together may use 2 cores in total; 2 cores are in "
        "use and this session asks for 1 more "
        "(user limit from keypair policy 'two', total_resource_slots)"
    )


def test_user_concurrency_spans_keypairs_in_plain_words(w, sm):
    w.policy("five", max_concurrent_sessions=5)
    w.policy("one", max_concurrent_sessions=1)
    w.agent("a1", cpu=8, mem="64g")
    w.user("alice", policy="five")
    w.keypair("alice", policy="one")
    w.enqueue("alice", "k1")
    w.enqueue("alice", "k2")
    assert w.names(schedule_pass(sm, "default")) == ["k1"]
    assert w.info("k2") == (
        "quota exceeded: you may have 1 session at a time across all your keypairs and 1 is "
        "already running or starting; this one waits until one ends "
        "(user limit from keypair policy 'one', max_concurrent_sessions)"
    )
    assert scheduler_stats(sm)["default"]["reasons"] == {"concurrency": 1}


def test_memory_quota_in_human_units(w, sm):
    w.policy("small", total=slots(cpu=8, mem="2g"))
    w.agent("a1", cpu=8, mem="64g")
    one_user(w, "small")
    w.enqueue("alice", "m1", mem="1536m")
    w.enqueue("alice", "m2", mem="1536m")
    assert w.names(schedule_pass(sm, "default")) == ["m1"]
    assert w.info("m2") == (
        "quota exceeded: your keypair's resource policy allows 2 GiB of memory in total; "
        "1.5 GiB of memory is in use and this session asks for 1.5 GiB more "
        "(keypair policy 'small', total_resource_slots)"
    )
    assert scheduler_stats(sm)["default"]["reasons"] == {"quota_keypair": 1}


def test_project_quota_counts_every_member_and_every_group(w, sm):
    w.project("team", total=slots(cpu=2))
    w.agent("a1", cpu=8, mem="64g")
    w.agent("o1", group="other", cpu=8, mem="64g")
    w.user("u1", project="team")
    w.user("u2", project="team")
    w.enqueue("u1", "elsewhere", group="other", project="team")
    assert len(schedule_pass(sm, "other")) == 1
    w.enqueue("u2", "here", project="team")
    w.enqueue("u1", "too-much", project="team")
    assert w.names(schedule_pass(sm, "default")) == ["here"]
    assert w.info("too-much") == (
        "quota exceeded: your project allows 2 cores in total; 2 cores are in use and this "
        "session asks for 1 more (project 'team', total_resource_slots)"
    )


def test_domain_quota(w, sm):
    w.domain("default", total=slots(cpu=1))
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)
    w.enqueue("alice", "s1")
    w.enqueue("alice", "s2")
    assert w.names(schedule_pass(sm, "default")) == ["s1"]
    assert w.info("s2") == (
        "quota exceeded: your domain allows 1 core in total; 1 core is in use and this "
        "session asks for 1 more (domain 'default', total_resource_slots)"
    )


def test_max_containers_per_session_holds_back_a_cluster(w, sm):
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)  # default policy: 1 container per session
    w.enqueue("alice", "cluster", cluster_size=2)
    assert schedule_pass(sm, "default") == []
    assert w.info("cluster") == (
        "quota exceeded: your keypair's resource policy allows at most 1 container per "
        "session; this session asks for 2 (keypair policy 'default', max_containers_per_session)"
    )


def test_dependencies_wait_for_success(w, sm):
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)
    w.enqueue("alice", "first")
    w.enqueue("alice", "second", deps=["first"])
    assert w.names(schedule_pass(sm, "default")) == ["first"]
    assert w.info("second") == "waiting for dependencies: first"
    w.finish("first", "TERMINATED", "SUCCESS")
    assert w.names(schedule_pass(sm, "default")) == ["second"]


def test_failed_dependency_cancels_with_the_reason(w, sm):
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)
    w.enqueue("alice", "first")
    w.enqueue("alice", "second", deps=["first"])
    schedule_pass(sm, "default")
    w.finish("first", "ERROR", "FAILURE")
    assert schedule_pass(sm, "default") == []
    sess = w.session("second")
    assert sess.status == "CANCELLED"
    assert sess.status_info == "cancelled: dependency first ended ERROR with result FAILURE"
    assert sess.alive_marker is None
    assert [(k.status, k.agent_id, k.occupied_slots) for k in sess.kernels] == [
        ("CANCELLED", None, {})
    ]
    assert check_consistency(sm) == []


def test_starts_at_in_the_future_waits(w, sm):
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)
    later = utcnow() + dt.timedelta(hours=1)
    w.enqueue("alice", "batch", starts_at=later)
    assert schedule_pass(sm, "default") == []
    assert w.info("batch").startswith("waiting for the start time ")
    assert w.names(schedule_pass(sm, "default", now=later + dt.timedelta(seconds=1))) == ["batch"]


def test_a_failed_start_waits_a_growing_backoff_before_its_next_try(w, sm):
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)
    sid = w.enqueue("alice", "flaky")
    requeued = utcnow()
    with sm.begin() as s:
        sess = s.get(Session, sid)
        sess.retries = 2
        set_status(sess, "PENDING", "start failed (no free host port); retry 2 of 3")
        hist = dict(sess.status_history)
        hist["PENDING"] = requeued.isoformat()
        sess.status_history = hist
    # retry_backoff 2 s, doubled once for the second retry: 4 s.
    assert schedule_pass(sm, "default", now=requeued + dt.timedelta(seconds=3.9)) == []
    assert w.info("flaky") == "start failed (no free host port); retry 2 of 3"
    assert w.names(schedule_pass(sm, "default", now=requeued + dt.timedelta(seconds=4.1))) == [
        "flaky"
    ]


def test_private_group_admits_the_union_of_its_allow_lists(w, sm):
    w.project("chosen")
    w.agent("p1", group="private", cpu=8, mem="64g")
    w.group("private", is_public=False, allowed_projects=["chosen"])
    w.user("member", project="chosen")
    outsider_key = w.user("outsider")
    w.user("stranger")
    w.group("private", allowed_keypairs=[outsider_key])
    w.enqueue("member", "by-project", group="private", project="chosen")
    w.enqueue("outsider", "by-keypair", group="private")
    w.enqueue("stranger", "refused", group="private")
    assert sorted(w.names(schedule_pass(sm, "private"))) == ["by-keypair", "by-project"]
    assert w.status("refused") == "CANCELLED"
    assert w.info("refused") == (
        "cancelled: resource group private is not allowed for this domain, project or keypair"
    )


def test_pending_timeout_cancels_and_holds_nothing(w, sm):
    w.group(scheduler_opts={"pending_timeout": 60})
    w.agent("a1", cpu=1, mem="64g")
    one_user(w)
    w.enqueue("alice", "running")
    w.enqueue("alice", "stuck")
    t0 = utcnow()
    assert w.names(schedule_pass(sm, "default", now=t0)) == ["running"]
    schedule_pass(sm, "default", now=t0 + dt.timedelta(seconds=120))
    assert w.status("stuck") == "CANCELLED"
    assert w.info("stuck") == "cancelled: pending timeout: not scheduled within 60 s"
    assert w.status("running") == "SCHEDULED"
    assert w.occupied("a1") == {"cpu": 1, "mem": GiB}
    assert check_consistency(sm) == []


def _await(sm, sid: str, seconds: float) -> None:
    """A JupyterHub spawner's wait on ``sid``, ending ``seconds`` from now (negative:
    it lapsed, as when the hub that asked was killed)."""
    with sm.begin() as s:
        s.get(Session, sid).awaited_until = utcnow() + dt.timedelta(seconds=seconds)


def test_a_session_nobody_awaits_any_more_is_never_placed(w, sm):
    """The hub that asked for it stopped (its spawner's wait lapsed): the lifecycle's
    Abandoned handler ends it, and no pass places it in between, neither a full pass
    nor the pass after a release that reuses the remembered queue."""
    w.agent("a1", cpu=1, mem="64g")
    one_user(w)
    w.enqueue("alice", "first")
    late = w.enqueue("alice", "late")
    w.enqueue("alice", "other")
    _await(sm, late, 60)
    assert w.names(schedule_pass(sm, "default")) == ["first"]
    assert schedule_pass(sm, "default") == []  # remembered: late and other wait
    _await(sm, late, -1)
    w.finish("first")
    # The release frees the room late would take first: other gets it.
    assert w.names(schedule_pass(sm, "default")) == ["other"]
    assert w.status("late") == "PENDING"
    w.finish("other")
    assert schedule_pass(sm, "default", force=True) == []
    assert w.status("late") == "PENDING" and w.occupied("a1") == {}
    # Its wait renewed (a slow hub, not a dead one): placed.
    _await(sm, late, 60)
    assert w.names(schedule_pass(sm, "default", force=True)) == ["late"]
    assert check_consistency(sm) == []


def test_a_history_never_goes_back_in_time(w, sm):
    """A pass takes its time before it reads the queue, so it may place a session that
    was enqueued after that moment: its SCHEDULED stamp is then its creation, never a
    time before its PENDING (the Backend.AI client's `session status-history` lists the
    stamps in time order)."""
    w.agent("a1", cpu=8, mem="64g")
    one_user(w)
    before = utcnow()
    w.enqueue("alice", "late")
    assert w.names(schedule_pass(sm, "default", now=before)) == ["late"]
    hist = {k: parse_utc(v) for k, v in w.session("late").status_history.items()}
    assert hist["PENDING"] <= hist["SCHEDULED"] <= utcnow(), hist
    # A pass whose time is after the session's creation stamps its own time.
    w.enqueue("alice", "next")
    later = utcnow() + dt.timedelta(seconds=5)
    assert w.names(schedule_pass(sm, "default", now=later)) == ["next"]
    assert parse_utc(w.session("next").status_history["SCHEDULED"]) == later


# -- selectors --------------------------------------------------------------------


def test_concentrated_packs_the_fullest_agent_that_fits(w, sm):
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=4, mem="64g")
    one_user(w)
    w.enqueue("alice", "first", cpu=3)
    schedule_pass(sm, "default")
    w.enqueue("alice", "second", cpu=1)
    schedule_pass(sm, "default")
    assert w.agents_of("first") == w.agents_of("second")


def test_dispersed_spreads_to_the_emptiest_agent(w, sm):
    w.group(scheduler_opts={"agent_selector": "dispersed"})
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=8, mem="64g")
    one_user(w)
    for n in ("s1", "s2", "s3"):
        w.enqueue("alice", n, cpu=2)
    schedule_pass(sm, "default")
    # 8 free beats 4, 6 beats 4; then 4 cores each, and a1 has more memory free.
    assert [w.agents_of(n)[0] for n in ("s1", "s2", "s3")] == ["a2", "a2", "a1"]


def test_roundrobin_takes_turns_and_keeps_the_cursor(w, sm):
    w.group(scheduler_opts={"agent_selector": "roundrobin"})
    for a in ("a1", "a2", "a3"):
        w.agent(a, cpu=4, mem="64g")
    one_user(w)
    for n in ("s1", "s2", "s3", "s4"):
        w.enqueue("alice", n)
        schedule_pass(sm, "default")  # one pass each: the cursor survives between passes
    assert [w.agents_of(n)[0] for n in ("s1", "s2", "s3", "s4")] == ["a1", "a2", "a3", "a1"]
    assert w.group_state()["rr_cursor"] == "a1"


@pytest.mark.parametrize("priority, expected", [(None, "cpu-node"), (["cpu", "mem"], "gpu-node")])
def test_resource_priority_decides_which_agent_is_fuller(w, sm, priority, expected):
    if priority:
        w.group(scheduler_opts={"resource_priority": priority})
    w.agent("gpu-node", cpu=8, mem="64g", gpu=4)
    w.agent("cpu-node", cpu=16, mem="64g")
    one_user(w)
    w.enqueue("alice", "cpu-only", cpu=1)
    schedule_pass(sm, "default")
    # GPUs first (default): a CPU-only session packs where no GPU is free.
    assert w.agents_of("cpu-only") == [expected]


def test_architecture_must_match(w, sm):
    w.agent("x86", cpu=8, mem="64g")
    w.agent("arm", arch="aarch64", cpu=8, mem="64g")
    one_user(w)
    w.enqueue("alice", "arm-job", arch="aarch64")
    w.enqueue("alice", "risc-job", arch="riscv64")
    assert w.names(schedule_pass(sm, "default")) == ["arm-job"]
    assert w.agents_of("arm-job") == ["arm"]
    assert w.info("risc-job") == (
        "waiting for resources: no agent of the group is large enough for cpu=1, mem=1g "
        "(single-node, 1 kernel(s)) (architecture riscv64)"
    )


def test_designated_agents_restrict_the_choice(w, sm):
    w.agent("a1", cpu=8, mem="64g")
    w.agent("a2", cpu=8, mem="64g")
    w.agent("a3", cpu=2, mem="64g")
    one_user(w)
    w.enqueue("alice", "pinned", designated=["a3", "a2"])
    schedule_pass(sm, "default")
    assert w.agents_of("pinned") == ["a3"]  # concentrated among the designated ones


# -- multi-kernel sessions ---------------------------------------------------------


def test_single_node_cluster_goes_to_one_agent(w, sm):
    w.policy("clusters", max_containers_per_session=4)
    w.agent("small", cpu=2, mem="64g")
    w.agent("large", cpu=4, mem="64g")
    one_user(w, "clusters")
    w.enqueue("alice", "c", cluster_size=3)
    assert len(schedule_pass(sm, "default")) == 1
    assert w.agents_of("c") == ["large", "large", "large"]
    assert w.occupied("large") == {"cpu": 3, "mem": 3 * GiB}


def test_multi_node_cluster_spreads_or_waits_all_or_nothing(w, sm):
    w.policy("clusters", max_containers_per_session=4)
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=4, mem="64g")
    one_user(w, "clusters")
    w.enqueue("alice", "three", cluster_size=3, mode="multi-node")
    w.enqueue("alice", "two", cluster_size=2, mode="multi-node")
    assert w.names(schedule_pass(sm, "default")) == ["two"]
    assert sorted(w.agents_of("two")) == ["a1", "a2"]
    assert w.agents_of("three") == [None, None, None]
    assert w.info("three") == (
        "waiting for resources: no agent of the group is large enough for cpu=3, mem=3g "
        "(multi-node, 3 kernel(s))"
    )
    assert w.occupied("a1") == w.occupied("a2") == {"cpu": 1, "mem": GiB}


# -- head-of-line blocking and starvation -------------------------------------------


def test_a_large_head_does_not_block_smaller_sessions(w, sm):
    w.agent("a1", cpu=2, mem="8g")
    one_user(w)
    w.enqueue("alice", "s1", cpu=1)
    w.enqueue("alice", "big", cpu=2)
    w.enqueue("alice", "s2", cpu=1)
    w.enqueue("alice", "s3", cpu=1)
    assert w.names(schedule_pass(sm, "default")) == ["s1", "s2"]
    assert w.info("big") == "waiting for resources: no agent has cpu=2, mem=1g free"
    assert w.occupied("a1") == {"cpu": 2, "mem": 2 * GiB}


def _churn(w: World, sm, reservations: int, passes: int) -> int | None:
    """Two 4-core agents full of 1-core sessions; one ends per pass and a new one
    arrives; "big" needs a whole agent. Returns the pass that placed big, or None."""
    w.group(scheduler_opts={"starvation_threshold": 100, "max_reservations": reservations})
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=4, mem="64g")
    one_user(w, "many")
    t0 = utcnow()
    running: list[str] = []
    for i in range(8):
        w.enqueue("alice", f"s{i}", created_at=t0)
        running.append(f"s{i}")
    schedule_pass(sm, "default", now=t0)
    w.enqueue("alice", "big", cpu=4, created_at=t0 + dt.timedelta(seconds=1))
    n = 8
    for p in range(passes):
        # The oldest small session ends; a new one arrives ahead of the next pass.
        w.finish(running.pop(0))
        w.enqueue("alice", f"s{n}", created_at=t0 + dt.timedelta(seconds=2 + p))
        running.append(f"s{n}")
        n += 1
        placed = w.names(schedule_pass(sm, "default", now=t0 + dt.timedelta(seconds=30 * (p + 1))))
        if "big" in placed:
            return p
        running = [r for r in running if w.status(r) == "SCHEDULED"] + [
            r for r in running if w.status(r) == "PENDING"
        ]
    return None


def test_small_sessions_starve_a_large_one_without_reservations(w, sm):
    w.policy("many", max_concurrent_sessions=100)
    assert _churn(w, sm, reservations=0, passes=12) is None
    assert w.info("big") == "waiting for resources: no agent has cpu=4, mem=1g free"


def test_a_starving_session_gets_agents_reserved_and_starts(w, sm):
    w.policy("many", max_concurrent_sessions=100)
    placed_at = _churn(w, sm, reservations=1, passes=12)
    # Starving from the 4th pass (index 3: 120 s > 100 s), it holds the agent with a
    # free core; the 3 older sessions there are among the 7 that end in the next 7 passes.
    assert placed_at is not None and 3 <= placed_at <= 3 + 7
    assert w.status("big") == "SCHEDULED"
    assert w.ids["big"] not in w.group_state().get("reservations", {})
    assert check_consistency(sm) == []


def test_the_reservation_is_recorded_and_shown(w, sm):
    w.group(scheduler_opts={"starvation_threshold": 0})
    w.agent("a1", cpu=4, mem="64g")
    w.agent("a2", cpu=4, mem="64g")
    one_user(w)
    w.enqueue("alice", "s1", cpu=3)
    w.enqueue("alice", "s2", cpu=2)
    schedule_pass(sm, "default")  # s1 on a1 (1 free), s2 on a2 (2 free)
    w.enqueue("alice", "big", cpu=4)
    w.enqueue("alice", "small", cpu=1)
    t = utcnow() + dt.timedelta(seconds=1)
    assert w.names(schedule_pass(sm, "default", now=t)) == ["small"]
    assert w.group_state()["reservations"] == {w.ids["big"]: ["a2"]}
    assert w.agents_of("small") == ["a1"]  # not on the reserved agent, though it packs worse
    assert w.info("big").startswith(
        "waiting for resources: no agent has cpu=4, mem=1g free; reserved agent(s) a2 for it"
    )


def test_only_the_oldest_starving_session_jumps_the_queue(w, sm):
    # Everything is past the threshold (as after an outage): the oldest goes first,
    # the rest keep the sequencer's order (priority here).
    w.group(scheduler_opts={"starvation_threshold": 0, "max_reservations": 1})
    w.agent("a1", cpu=2, mem="64g")
    one_user(w)
    w.enqueue("alice", "oldest-low", priority=10)
    w.enqueue("alice", "mid", priority=50)
    w.enqueue("alice", "high", priority=90)
    later = utcnow() + dt.timedelta(seconds=5)
    assert w.names(schedule_pass(sm, "default", now=later)) == ["oldest-low", "high"]


# -- admission at enqueue ------------------------------------------------------------


def _new_session(s, w: World, user: str, **kw) -> Session:
    per = kw.pop("per", slots(cpu=1, mem="1g"))
    size = kw.pop("cluster_size", 1)
    sess = Session(name=kw.pop("name", "new"), user_id=w.uids[user], access_key=w.keys[user],
                   domain_name="default", resource_group=kw.pop("group", "default"),
                   image="img", requested_slots=per, cluster_size=size,
                   project_id=s.scalar(select(Project.id).where(Project.name == "default")), **kw)
    for i in range(size):
        sess.kernels.append(Kernel(requested_slots=per, cluster_idx=i))
    return sess


@pytest.mark.parametrize(
    "setup, request_kw, error, message",
    [
        ({"max_pending_session_count": 1}, {}, QuotaExceeded,
         "quota exceeded: keypair max_pending_session_count (1 of 1 pending)"),
        ({"max_pending_session_resource_slots": slots(cpu=1.5)}, {}, QuotaExceeded,
         "quota exceeded: keypair max_pending_session_resource_slots "
         "(cpu 1 of 1.5 pending, 1 requested)"),
        ({"max_priority": 60}, {"priority": 70}, QuotaExceeded,
         "quota exceeded: keypair max_priority (priority 70 requested, limit 60)"),
        ({}, {"cluster_size": 2}, QuotaExceeded,
         "quota exceeded: keypair max_containers_per_session (2 requested, limit 1)"),
        ({"total_resource_slots": slots(cpu=2)}, {"per": slots(cpu=3, mem="1g")}, QuotaExceeded,
         "quota exceeded: keypair total_resource_slots (cpu 3 requested, limit 2): "
         "it could never start"),
        ({}, {"group": "private"}, Forbidden,
         "resource group 'private' is not allowed for this domain, project or keypair"),
    ],
)
def test_admission_refuses_with_a_4xx_and_creates_nothing(w, sm, setup, request_kw, error,
                                                          message):
    w.policy("p", **setup)
    w.group("private", is_public=False)
    one_user(w, "p")
    w.enqueue("alice", "already-pending")
    with pytest.raises(error) as exc:
        with sm.begin() as s:
            sess = _new_session(s, w, "alice", **request_kw)
            s.add(sess)
            admit(s, sess)
    assert exc.value.detail == message
    assert 400 <= exc.value.status_code < 500
    assert list(w.statuses()) == ["already-pending"]


def test_admission_accepts_what_is_within_every_limit(w, sm):
    w.policy("p", max_pending_session_count=2, max_priority=80,
             total_resource_slots=slots(cpu=4))
    one_user(w, "p")
    w.enqueue("alice", "already-pending")
    with sm.begin() as s:
        sess = _new_session(s, w, "alice", priority=80)
        s.add(sess)
        admit(s, sess)
    assert sorted(w.statuses()) == ["already-pending", "new"]


# -- release, consistency, two schedulers, observability --------------------------------


def test_release_frees_exactly_what_was_taken(w, sm):
    w.agent("a1", cpu=1, mem="4g")
    one_user(w)
    w.enqueue("alice", "s1", cpu="0.33")
    w.enqueue("alice", "s2", cpu="0.67")
    schedule_pass(sm, "default")
    w.finish("s1")
    assert w.occupied("a1") == {"cpu": Decimal("0.67"), "mem": GiB}
    assert check_consistency(sm) == []


def test_check_consistency_reports_each_kind_of_problem(w, sm):
    w.agent("a1", cpu=2, mem="8g")
    one_user(w)
    w.enqueue("alice", "s1")
    w.enqueue("alice", "s2")
    schedule_pass(sm, "default")
    assert check_consistency(sm) == []
    with sm.begin() as s:
        s.scalar(select(Project).where(Project.name == "default")).total_resource_slots = slots(cpu=1)
        s.get(KeypairResourcePolicy, "default").max_concurrent_sessions = 1
        s.get(Agent, "a1").available_slots = slots(cpu=1, mem="8g")
        s.get(Session, w.ids["s2"]).status = "TERMINATED"  # dead, but its kernel still holds
    s2_kernel = w.session("s2").kernels[0].id
    over = "agent a1 over capacity: occupied cpu=2, mem=2g > available cpu=1, mem=8g"
    assert sorted(check_consistency(sm)) == sorted([
        over,
        f"kernel {s2_kernel} of TERMINATED session {w.ids['s2']} holds cpu=1, mem=1g",
    ])
    with sm.begin() as s:
        s.get(Session, w.ids["s2"]).status = "RUNNING"
    ak, pid = w.keys["alice"], w.session("s1").project_id
    assert sorted(check_consistency(sm)) == sorted([
        over,
        f"quota exceeded: keypair {ak} max_concurrent_sessions: 2 live > limit 1",
        f"quota exceeded: project {pid} total_resource_slots: cpu 2 in use > limit 1",
    ])


def test_check_consistency_applies_limited_keypairs_to_slots_a_limit_leaves_out(w, sm):
    """A project limit naming only CPU: memory is free for UNLIMITED keypairs, forbidden for
    LIMITED ones (as the validators decide it); the checker agrees with the validators."""
    w.agent("a1", cpu=8, mem="64g")
    w.policy("strict", default_for_unspecified="LIMITED")
    w.project("default", total=slots(cpu=4))
    w.user("loose")
    strict_key = w.user("strict", policy="strict")
    w.enqueue("loose", "free-mem", cpu=1, mem="1g")
    w.enqueue("strict", "no-mem", cpu=1, mem="1g")
    placed = w.names(schedule_pass(sm, "default"))
    assert placed == ["free-mem"]  # the validator refuses memory to the LIMITED keypair
    assert w.info("no-mem") == (
        "quota exceeded: your project allows 0 bytes of memory in total; 1 GiB of memory is "
        "in use and this session asks for 1 GiB more (project 'default', total_resource_slots)"
    )
    assert check_consistency(sm) == []
    # Placed behind the scheduler's back: the checker must report it.
    with sm.begin() as s:
        sess = s.get(Session, w.ids["no-mem"])
        k = sess.kernels[0]
        k.agent_id, k.occupied_slots, k.status = "a1", ResourceSlot(k.requested_slots), "RUNNING"
        sess.status = "RUNNING"
        a = s.get(Agent, "a1")
        a.occupied_slots = a.occupied_slots + k.requested_slots
    pid = w.session("no-mem").project_id
    assert check_consistency(sm) == [
        f"quota exceeded: project {pid} total_resource_slots: keypair {strict_key} (LIMITED) "
        "holds mem 1g, which the limit leaves out"
    ]


def test_two_schedulers_at_once_never_overcommit(w, sm):
    w.policy("many", max_concurrent_sessions=100)
    w.agent("a1", cpu=3, mem="64g")
    w.agent("a2", cpu=2, mem="64g")
    one_user(w, "many")
    for i in range(40):
        w.enqueue("alice", f"s{i}")
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
    assert w.occupied("a1")["cpu"] == 3 and w.occupied("a2")["cpu"] == 2
    assert check_consistency(sm) == []


def test_metrics_and_stats_describe_the_queue(w, sm):
    group = "metrics-" + w.uids.get("x", str(id(w)))[-8:]  # fresh label set per run
    w.agent("m1", group=group, cpu=1, mem="64g")
    w.policy("two", max_concurrent_sessions=2)
    one_user(w, "two")
    w.enqueue("alice", "s1", group=group)
    w.enqueue("alice", "s2", group=group)
    w.enqueue("alice", "s3", group=group)

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, {"resource_group": group, **labels}) or 0

    names = ("backendai_scheduler_placements_total", "backendai_scheduler_wait_seconds_count",
             "backendai_scheduler_pass_seconds_count")
    before = [sample(n) for n in names]
    rejected = sample("backendai_scheduler_rejections_total", reason="no_resources")
    schedule_pass(sm, group)
    assert [sample(n) - b for n, b in zip(names, before, strict=True)] == [1, 1, 1]
    assert sample("backendai_scheduler_rejections_total", reason="no_resources") - rejected == 2
    assert sample("backendai_scheduler_queue_length") == 2
    stats = scheduler_stats(sm)[group]
    assert stats["pending"] == 2
    assert stats["reasons"] == {"no_resources": 2}
    assert stats["live"] == 1
    assert stats["scheduler"] == "fifo" and stats["agent_selector"] == "concentrated"
    assert stats["oldest_wait_s"] >= 0


def test_domain_rows_untouched_by_a_pass(w, sm):
    """A pass writes sessions, kernels, agents and its group's state, nothing else."""
    w.domain("default", total=slots(cpu=8))
    w.agent("a1", cpu=2, mem="8g")
    one_user(w)
    w.enqueue("alice", "s1")
    schedule_pass(sm, "default")
    with sm() as s:
        assert s.get(Domain, "default").total_resource_slots == {"cpu": 8}
