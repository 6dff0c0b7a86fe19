"""Scheduler properties over random agents, policies and arrival sequences (hypothesis).

- capacity and every quota hold after every pass, and nothing waits "for
  resources" while an agent it could use has room for it (no head-of-line
  blocking);
- DRF: every placement goes to the user with the lowest dominant share among
  those whose next session fits (progressive filling), and a pass leaves no
  session behind that would still fit;
- no starvation: a session that needs a whole agent, arriving into a stream of
  small sessions, is placed at most ``lifetime`` passes after it starts to starve.

Examples are bounded to keep the file fast: full sets on SQLite, a few on
PostgreSQL (same code, different locking).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from jupyterhub_backendai.manager.scheduler import check_consistency, schedule_pass
from jupyterhub_backendai.models import Agent, Kernel, Session
from jupyterhub_backendai.models.base import utcnow

from .scheduler_world import World, slots


def _examples(sm, sqlite: int, pg: int) -> int:
    return sqlite if sm.kw["bind"].dialect.name == "sqlite" else pg


def _settings(n: int):
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


# -- capacity, quotas and no head-of-line blocking ---------------------------------------

agent_st = st.fixed_dictionaries({
    "cpu": st.sampled_from([1, 2, 4, 8]),
    "mem": st.sampled_from([2, 4, 8, 16]),
    "gpu": st.sampled_from([0, 0, 1, 2]),
})
user_st = st.fixed_dictionaries({
    "cpu_limit": st.one_of(st.none(), st.integers(1, 6)),
    "dfu": st.sampled_from(["UNLIMITED", "LIMITED"]),
    "concurrent": st.integers(1, 8),
    "containers": st.integers(1, 3),
    "project": st.sampled_from(["default", "team"]),
})
enqueue_st = st.tuples(
    st.just("enqueue"), st.integers(0, 3), st.sampled_from(["0.5", "1", "2", "3"]),
    st.sampled_from([1, 2, 4]), st.sampled_from([0, 0, 1]), st.integers(1, 3),
    st.sampled_from(["single-node", "multi-node"]), st.integers(0, 100),
)
step_st = st.one_of(  # arrivals three times as often as passes or endings
    enqueue_st, enqueue_st, enqueue_st,
    st.just(("pass",)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
)
world_st = st.fixed_dictionaries({
    "agents": st.lists(agent_st, min_size=1, max_size=4),
    "users": st.lists(user_st, min_size=1, max_size=4),
    "project_cpu": st.one_of(st.none(), st.integers(1, 8)),
    "domain_cpu": st.one_of(st.none(), st.integers(2, 10)),
    "scheduler": st.sampled_from(["fifo", "lifo", "drf"]),
    "selector": st.sampled_from(["concentrated", "dispersed", "roundrobin"]),
    "steps": st.lists(step_st, min_size=1, max_size=30),
})


def _free_agents(sm) -> dict[str, object]:
    with sm() as s:
        return {a.id: a.available_slots - a.occupied_slots for a in s.scalars(select(Agent))}


def _assert_no_blocked_fit(w: World, sm) -> None:
    """Nothing waits for resources while an unreserved agent could hold it."""
    reserved = {a for held in (w.group_state().get("reservations") or {}).values() for a in held}
    free = {a: f for a, f in _free_agents(sm).items() if a not in reserved}
    with sm() as s:
        waiting = s.scalars(select(Session).where(
            Session.status == "PENDING", Session.status_info.like("waiting for resources%")
        )).all()
        for sess in waiting:
            per = sess.kernels[0].requested_slots
            if sess.cluster_mode == "multi-node" and sess.cluster_size > 1:
                fitting = [a for a, f in free.items() if per.fits_in(f)]
                assert len(fitting) < sess.cluster_size, (sess.name, sess.status_info, fitting)
            else:
                need = slots()
                for k in sess.kernels:
                    need = need + k.requested_slots
                assert not any(need.fits_in(f) for f in free.values()), (sess.name, need, free)


def _build(w: World, spec: dict) -> None:
    w.group(scheduler=spec["scheduler"], scheduler_opts={"agent_selector": spec["selector"]})
    for i, a in enumerate(spec["agents"]):
        w.agent(f"a{i}", cpu=a["cpu"], mem=f"{a['mem']}g", gpu=a["gpu"] or None)
    w.project("team", total=slots(cpu=spec["project_cpu"]) if spec["project_cpu"] else None)
    if spec["domain_cpu"]:
        w.domain("default", total=slots(cpu=spec["domain_cpu"]))
    for i, u in enumerate(spec["users"]):
        w.policy(f"p{i}", total=slots(cpu=u["cpu_limit"], mem="64g") if u["cpu_limit"] else None,
                 default_for_unspecified=u["dfu"], max_concurrent_sessions=u["concurrent"],
                 max_containers_per_session=u["containers"])
        w.user(f"u{i}", policy=f"p{i}", project=u["project"])


def test_capacity_quotas_and_no_hol_blocking_hold_after_every_pass(sm):
    w = World(sm)

    @_settings(_examples(sm, 80, 8))
    @given(spec=world_st)
    def prop(spec):
        w.wipe()
        _build(w, spec)
        n = 0
        for step in spec["steps"] + [("pass",)]:
            if step[0] == "enqueue":
                _, u, cpu, mem, gpu, size, mode, prio = step
                u %= len(spec["users"])
                w.enqueue(f"u{u}", f"s{n}", cpu=cpu, mem=f"{mem}g", gpu=gpu or None,
                          cluster_size=size, mode=mode, priority=prio,
                          project=spec["users"][u]["project"])
                n += 1
            elif step[0] == "finish":
                live = [name for name, status in sorted(w.statuses().items())
                        if status == "SCHEDULED"]
                if live:
                    w.finish(live[step[1] % len(live)])
            else:
                schedule_pass(sm, "default")
                assert check_consistency(sm) == []
                _assert_no_blocked_fit(w, sm)

    prop()


queue_st = st.fixed_dictionaries({
    "agents": st.lists(agent_st, min_size=1, max_size=5),
    "queue": st.lists(st.tuples(st.sampled_from(["0.5", "1", "2", "4", "8"]),
                                st.sampled_from([1, 2, 8]), st.sampled_from([0, 0, 1, 2]),
                                st.integers(1, 3), st.booleans(), st.integers(0, 100)),
                      min_size=1, max_size=30),
    "scheduler": st.sampled_from(["fifo", "lifo", "drf"]),
    "selector": st.sampled_from(["concentrated", "dispersed", "roundrobin"]),
})


def test_one_pass_leaves_nothing_waiting_that_would_fit(sm):
    w = World(sm)

    @_settings(_examples(sm, 80, 8))
    @given(spec=queue_st)
    def prop(spec):
        w.wipe()
        w.group(scheduler=spec["scheduler"], scheduler_opts={"agent_selector": spec["selector"]})
        for i, a in enumerate(spec["agents"]):
            w.agent(f"a{i}", cpu=a["cpu"], mem=f"{a['mem']}g", gpu=a["gpu"] or None)
        w.policy("open", max_concurrent_sessions=100, max_containers_per_session=3)
        w.user("u0", policy="open")
        w.user("u1", policy="open")
        for n, (cpu, mem, gpu, size, multi, prio) in enumerate(spec["queue"]):
            w.enqueue(f"u{n % 2}", f"s{n}", cpu=cpu, mem=f"{mem}g", gpu=gpu or None,
                      cluster_size=size, mode="multi-node" if multi else "single-node",
                      priority=prio)
        schedule_pass(sm, "default")
        assert check_consistency(sm) == []
        _assert_no_blocked_fit(w, sm)

    prop()


# -- DRF -----------------------------------------------------------------------------------

drf_st = st.fixed_dictionaries({
    "cpu": st.integers(4, 16),
    "mem": st.integers(4, 32),
    "users": st.lists(
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 8), st.integers(0, 2)),
        min_size=2, max_size=4,
    ),
})


def _held(sm) -> dict[str, object]:
    """Per user: the slots their placed sessions hold."""
    held: dict[str, object] = defaultdict(slots)
    with sm() as s:
        for uid, occ in s.execute(
            select(Session.user_id, Kernel.occupied_slots)
            .join(Kernel, Kernel.session_id == Session.id)
            .where(Session.status == "SCHEDULED")
        ):
            held[uid] = held[uid] + occ
    return held


def test_drf_places_by_lowest_dominant_share(sm):
    w = World(sm)

    @_settings(_examples(sm, 50, 6))
    @given(spec=drf_st)
    def prop(spec):
        w.wipe()
        w.group(scheduler="drf")
        w.agent("a1", cpu=spec["cpu"], mem=f"{spec['mem']}g")
        capacity = slots(cpu=spec["cpu"], mem=f"{spec['mem']}g")
        w.policy("many", max_concurrent_sessions=100)
        shape = {}
        for i, (cpu, mem, _count, head_start) in enumerate(spec["users"]):
            w.user(f"u{i}", policy="many")
            shape[w.uids[f"u{i}"]] = slots(cpu=cpu, mem=f"{mem}g")
            for j in range(head_start):  # some users already hold something
                w.enqueue(f"u{i}", f"u{i}-early{j}", cpu=cpu, mem=f"{mem}g")
        schedule_pass(sm, "default")
        for i, (cpu, mem, count, _) in enumerate(spec["users"]):
            for j in range(count):
                w.enqueue(f"u{i}", f"u{i}-s{j}", cpu=cpu, mem=f"{mem}g")
        left: dict[str, int] = defaultdict(int)
        owner = {}
        with sm() as s:
            for sid, uid, status in s.execute(select(Session.id, Session.user_id, Session.status)):
                owner[sid] = uid
                left[uid] += status == "PENDING"
        held = _held(sm)
        free = _free_agents(sm)["a1"]

        def share(uid) -> Decimal:
            return max(held[uid].get(k, Decimal(0)) / c for k, c in capacity.items())

        for sid in schedule_pass(sm, "default"):
            u = owner[sid]
            eligible = [v for v, n in left.items() if n > 0 and shape[v].fits_in(free)]
            assert u in eligible
            assert share(u) == min(share(v) for v in eligible), (u, eligible)
            free = free - shape[u]
            held[u] = held[u] + shape[u]
            left[u] -= 1
        # Work conserving: nothing is left behind that would still fit.
        assert not any(n > 0 and shape[v].fits_in(free) for v, n in left.items())
        assert check_consistency(sm) == []

    prop()


# -- starvation ---------------------------------------------------------------------------

churn_st = st.fixed_dictionaries({
    "agents": st.integers(1, 3),
    "lifetime": st.integers(1, 4),
    "arrivals": st.lists(st.integers(0, 3), min_size=40, max_size=40),
    "sizes": st.lists(st.sampled_from([1, 2]), min_size=160, max_size=160),
    "lives": st.lists(st.integers(1, 4), min_size=160, max_size=160),
})


def test_a_large_session_never_starves_behind_a_stream_of_small_ones(sm):
    w = World(sm)
    threshold, step = 60, 30  # seconds; a pass every 30 s: starving from the 3rd pass

    @_settings(_examples(sm, 50, 5))
    @given(spec=churn_st)
    def prop(spec):
        w.wipe()
        w.group(scheduler_opts={"starvation_threshold": threshold})
        w.policy("many", max_concurrent_sessions=1000)
        w.user("big", policy="many")
        w.user("small", policy="many")
        for i in range(spec["agents"]):
            w.agent(f"a{i}", cpu=4, mem="64g")
        t0 = utcnow()
        ends: dict[str, int] = {}  # running small session -> pass index at which it ends
        k = 0

        def arrive(count, p):
            nonlocal k
            for _ in range(count):
                w.enqueue("small", f"s{k}", cpu=spec["sizes"][k % 160],
                          created_at=t0 + dt.timedelta(seconds=step * p + 1 + k * 0.001))
                k += 1

        # Fill the agents exactly, then the big one arrives: the oldest pending from now on.
        for i in range(2 * spec["agents"]):
            w.enqueue("small", f"s{k}", cpu=2, created_at=t0 - dt.timedelta(seconds=50 - i))
            k += 1
        for sid in schedule_pass(sm, "default", now=t0 - dt.timedelta(seconds=step)):
            name = w.names([sid])[0]
            ends[name] = spec["lives"][int(name[1:]) % 160] - 1
        w.enqueue("big", "big", cpu=4, created_at=t0)
        lifetime = 4
        starving_from = None
        for p in range(len(spec["arrivals"])):
            for name, end in list(ends.items()):
                if end <= p:
                    w.finish(name)
                    del ends[name]
            arrive(spec["arrivals"][p], p)
            now = t0 + dt.timedelta(seconds=step * p + 1)
            if starving_from is None and (now - t0).total_seconds() >= threshold:
                starving_from = p
            placed = w.names(schedule_pass(sm, "default", now=now))
            if "big" in placed:
                # The reserved agent's sessions all started before it starved and
                # live at most `lifetime` passes: by then the agent is empty.
                assert starving_from is None or p <= starving_from + lifetime - 1
                return
            for name in placed:
                ends[name] = p + spec["lives"][int(name[1:]) % 160]
            assert starving_from is None or p < starving_from + lifetime - 1, "big starved"
        raise AssertionError("big never placed")

    prop()
