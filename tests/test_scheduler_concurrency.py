"""Two scheduler instances against one PostgreSQL, 200 requests from 20 users at once.

Each scheduler has its own engine (as two hubs would), both run passes over
both resource groups in a loop (keypair, user, project and domain quotas span
the groups); meanwhile 20 users submit 10 requests each (admission in the creating
transaction), a third party ends placed sessions, and a checker runs
``check_consistency`` over and over. Zero over-commit of capacity or of any
quota, at any moment; every request ends placed or refused with a reason.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.common.errors import QuotaExceeded
from jupyterhub_backendai.manager import tenancy
from jupyterhub_backendai.manager.lifecycle.record import set_status
from jupyterhub_backendai.manager.scheduler import (
    admit,
    check_consistency,
    schedule_pass,
)
from jupyterhub_backendai.models import Kernel, Project, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker, upgrade

from .scheduler_world import World, slots

USERS, REQUESTS, PENDING_LIMIT = 20, 10, 6
GROUPS = ("default", "second")


@pytest.fixture
def pg_url(postgres):
    import uuid

    url = postgres.new_database("t_" + uuid.uuid4().hex[:12])
    engine = make_engine(url)
    upgrade(engine)
    with make_sessionmaker(engine).begin() as s:
        tenancy.ensure_defaults(s)
    engine.dispose()
    return url


def test_two_schedulers_200_requests_no_overcommit(pg_url):
    engines = [make_engine(pg_url, pool_size=25, max_overflow=5) for _ in range(4)]
    clients, sched_a, sched_b, other = (make_sessionmaker(e) for e in engines)
    w = World(other)
    for i in range(6):  # two resource groups: quotas span them
        w.agent(f"a{i}", group=GROUPS[i % 2], cpu=8, mem="64g")
    w.policy("team", total=slots(cpu=4), max_concurrent_sessions=3,
             max_containers_per_session=2, max_pending_session_count=PENDING_LIMIT)
    for p in range(4):
        w.project(f"p{p}", total=slots(cpu=9) if p % 2 == 0 else None)
    w.domain("default", total=slots(cpu=40))
    for u in range(USERS):
        w.user(f"u{u}", policy="team", project=f"p{u % 4}")
    with other() as s:
        project_ids = {p.name: p.id for p in s.scalars(select(Project))}

    stop = threading.Event()
    errors: list[BaseException] = []
    refused: list[str] = []
    admitted: list[str] = []
    problems: list[list[str]] = []
    passes = Counter()

    def guarded(fn):
        def run(*a):
            try:
                fn(*a)
            except BaseException as e:  # surfaced by the main thread
                errors.append(e)
                stop.set()
        return run

    @guarded
    def submit(u: int) -> None:
        rnd = random.Random(u)
        for r in range(REQUESTS):
            size = 2 if r % 5 == 4 else 1
            per = slots(cpu=rnd.choice([1, 2]) if size == 1 else 1, mem="1g")
            try:
                with clients.begin() as s:
                    sess = Session(
                        name=f"u{u}-r{r}", user_id=w.uids[f"u{u}"], access_key=w.keys[f"u{u}"],
                        domain_name="default", project_id=project_ids[f"p{u % 4}"],
                        resource_group=GROUPS[r % 2], image="img", requested_slots=per,
                        cluster_size=size, cluster_mode="multi-node" if size > 1 else "single-node",
                    )
                    set_status(sess, "PENDING", "waiting for the scheduler")
                    for k in range(size):
                        sess.kernels.append(Kernel(requested_slots=per, cluster_idx=k))
                    s.add(sess)
                    s.flush()
                    admit(s, sess)
                    sid = sess.id
                admitted.append(sid)
            except QuotaExceeded as e:
                refused.append(e.detail)
                time.sleep(0.02)  # a user retries later, as a client would

    @guarded
    def scheduler(sm, name: str) -> None:
        while not stop.is_set():  # as a manager does: every group in turn
            for g in GROUPS:
                schedule_pass(sm, g)
            passes[name] += 1

    @guarded
    def finisher() -> None:
        while not stop.is_set():
            with other() as s:
                placed = s.scalars(select(Session.id).where(Session.status == "SCHEDULED")).all()
            for sid in placed[:5]:
                w.finish(sid)  # frees its slots and marks it TERMINATED in one transaction
            time.sleep(0.01)

    @guarded
    def checker() -> None:
        while not stop.is_set():
            found = check_consistency(other)
            with other() as s:
                for ak, n in s.execute(
                    select(Session.access_key, func.count()).where(Session.status == "PENDING")
                    .group_by(Session.access_key)
                ):
                    if n > PENDING_LIMIT:
                        found.append(f"{ak}: {n} pending > {PENDING_LIMIT}")
            if found:
                problems.append(found)

    threads = [threading.Thread(target=submit, args=(u,)) for u in range(USERS)]
    threads += [
        threading.Thread(target=scheduler, args=(sched_a, "a")),
        threading.Thread(target=scheduler, args=(sched_b, "b")),
        threading.Thread(target=finisher),
        threading.Thread(target=checker),
    ]
    for t in threads:
        t.start()
    for t in threads[:USERS]:
        t.join()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not stop.is_set():
        with other() as s:
            left = s.scalar(select(func.count()).select_from(Session)
                            .where(Session.status.in_(["PENDING", "SCHEDULED"])))
        if left == 0:
            break
        time.sleep(0.1)
    stop.set()
    for t in threads[USERS:]:
        t.join()
    for e in engines:
        e.dispose()

    assert errors == []
    assert problems == []
    assert len(admitted) + len(refused) == USERS * REQUESTS
    assert all(r.startswith("quota exceeded: keypair max_pending_session_count") for r in refused)
    assert passes["a"] > 0 and passes["b"] > 0
    with other() as s:
        rows = s.execute(select(Session.id, Session.status, Session.status_history)).all()
    assert sorted(r.id for r in rows) == sorted(admitted)
    # Every admitted request was placed (and then ended): none is left waiting.
    assert [(r.id, r.status) for r in rows if "SCHEDULED" not in r.status_history] == []
    assert check_consistency(other) == []
