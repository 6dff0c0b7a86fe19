"""Scheduler throughput on a real database, no containers.

A agents (half CPU nodes: 64 cores, 256 GiB; half GPU nodes: 64 cores,
512 GiB, 8 GPUs) and P pending sessions of mixed shapes from 100 users
(1 core/2 GiB 40 %, 2/8 25 %, 4/16 15 %, 8/32+1 GPU 10 %, 16/64+4 GPUs 5 %,
multi-node 2 x 4/16 5 %) are written straight into the database, then
``schedule_pass`` runs until a pass places nothing. Reported: placements per
second over the passes, time per pass and where it went (lock, load, decide in
memory, write, commit; with the process's own CPU time per phase, the rest being
the database's work or waiting for a CPU), and ``check_consistency`` at the end.

    python benchmarks/scheduler.py --agents 1000 --pending 10000            # SQLite file
    python benchmarks/scheduler.py --agents 1000 --pending 10000 --db postgres
    python benchmarks/scheduler.py --curve [--db postgres]

``--db postgres`` starts a throwaway PostgreSQL (tests/services.py); any other
value is the SQLAlchemy URL of an empty database. The last line is
``agents=<n> pending=<n> placed=<n> seconds=<f> placements_per_s=<f> waiting=<n>
idle_loop_s=<f> changed_loop_s=<f> released_loop_s=<f>`` (idle_loop_s: the median cost of the loop's pass
once the queue cannot move, which is skipped as nothing changed; changed_loop_s: the
median cost of a pass after one session arrived, of 3; released_loop_s: the median
cost of a pass after one placed session ended, of 3, the queue still waiting).

    python benchmarks/scheduler.py --agents 10000 --pending 100000 --db postgres --baseline HEAD

``--baseline REV`` populates one database, then runs the passes on copies of it with
the package of git revision REV and with this checkout's, alternately (``--rounds``
each, every run in its own process): on a shared machine only figures taken side by
side compare. Its last line adds ``baseline_seconds``, ``ratio`` (this / baseline,
medians), ``baseline_changed_loop_s`` and ``released_loop_s``/``baseline_released_loop_s``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --baseline runs this script again with another version's package (BENCH_CODE).
sys.path.insert(0, os.environ.get("BENCH_CODE") or REPO)

from sqlalchemy import insert, select  # noqa: E402

from jupyterhub_backendai.common.slots import ResourceSlot  # noqa: E402
from jupyterhub_backendai.manager import tenancy  # noqa: E402

try:  # the scheduler's home since issue 23 (and the lifecycle's writes beside it)
    from jupyterhub_backendai.manager.lifecycle import record as writes  # noqa: E402
    from jupyterhub_backendai.manager.scheduler import dispatcher  # noqa: E402
except ImportError:  # a --baseline from before issue 23
    from jupyterhub_backendai.scheduler import dispatcher  # noqa: E402

    writes = dispatcher
from jupyterhub_backendai.models import (  # noqa: E402
    Agent,
    Kernel,
    Keypair,
    KeypairResourcePolicy,
    Project,
    Session,
    User,
    project_members,
)
from jupyterhub_backendai.models.base import utcnow  # noqa: E402
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker, upgrade  # noqa: E402

GiB = 2**30
SHAPES = [  # (weight, cpu, mem GiB, gpu, cluster_size)
    (40, 1, 2, 0, 1),
    (25, 2, 8, 0, 1),
    (15, 4, 16, 0, 1),
    (10, 8, 32, 1, 1),
    (5, 16, 64, 4, 1),
    (5, 4, 16, 0, 2),
]


def populate(sm, agents: int, pending: int, users: int = 100, seed: int = 1) -> None:
    rnd = random.Random(seed)
    with sm.begin() as s:
        tenancy.ensure_defaults(s)
        s.add(KeypairResourcePolicy(name="bench", max_concurrent_sessions=10**9,
                                    max_containers_per_session=4))
        s.flush()
        pid = s.query(Project.id).filter(Project.name == "default").scalar()
        urows, krows, mrows = [], [], []
        for i in range(users):
            uid = uuid.uuid4().hex
            urows.append(dict(id=uid, email=f"u{i}@bench", username=f"u{i}", password="x" * 60,
                              domain_name="default", status="active", role="user"))
            krows.append(dict(access_key=f"AKBENCH{i:013d}", secret_key="s" * 40, user_id=uid,
                              is_default=True, resource_policy="bench"))
            mrows.append(dict(project_id=pid, user_id=uid))
        s.execute(insert(User), urows)
        s.execute(insert(Keypair), krows)
        s.execute(insert(project_members), mrows)
        arows = []
        for i in range(agents):
            gpu = i % 2 == 1
            cap = {"cpu": 64, "mem": (512 if gpu else 256) * GiB}
            if gpu:
                cap["cuda.device"] = 8
            arows.append(dict(id=f"agent-{i:05d}", resource_group="default",
                              architecture="x86_64", available_slots=ResourceSlot(cap),
                              occupied_slots=ResourceSlot(), status="ALIVE", schedulable=True))
        s.execute(insert(Agent), arows)
        weights = [w for w, *_ in SHAPES]
        # All created in the last minute, none in the future (a session created after
        # the newest one a pass saw is an arrival; one created before it is not).
        t0 = utcnow() - dt.timedelta(seconds=60)
        srows, kr = [], []
        for i in range(pending):
            _, cpu, mem, gpu, size = rnd.choices(SHAPES, weights)[0]
            per = {"cpu": cpu, "mem": mem * GiB}
            if gpu:
                per["cuda.device"] = gpu
            sid = uuid.uuid4().hex
            u = rnd.randrange(users)
            srows.append(dict(
                id=sid, name=f"s{i}", user_id=urows[u]["id"], access_key=krows[u]["access_key"],
                domain_name="default", project_id=pid, resource_group="default", image="img",
                cluster_size=size, cluster_mode="multi-node" if size > 1 else "single-node",
                priority=50, requested_slots=ResourceSlot(per), status="PENDING",
                status_info="waiting for the scheduler", status_history={"PENDING": t0.isoformat()},
                created_at=t0 + dt.timedelta(microseconds=100 * i), alive_marker=1,
                designated_agents=[], environ={},
            ))
            for k in range(size):
                kr.append(dict(id=uuid.uuid4().hex, session_id=sid, cluster_idx=k,
                               cluster_role="main" if k == 0 else "sub",
                               requested_slots=ResourceSlot(per), occupied_slots=ResourceSlot(),
                               status="PENDING"))
        for i in range(0, len(srows), 5000):
            s.execute(insert(Session), srows[i : i + 5000])
        for i in range(0, len(kr), 5000):
            s.execute(insert(Kernel), kr[i : i + 5000])


def run(url: str, agents: int, pending: int, verbose: bool = True,
        populated: bool = False) -> dict:
    engine = make_engine(url)
    sm = make_sessionmaker(engine)
    t = time.perf_counter()
    if not populated:
        upgrade(engine)
        populate(sm, agents, pending)
    setup_s = time.perf_counter() - t
    backend_cpu = _backend_cpu_probe(engine)
    passes = []
    placed = 0
    while True:
        got = dispatcher.schedule_pass(sm, "default")
        passes.append(dict(dispatcher.LAST_PASS))
        placed += len(got)
        if not got:
            break
    # The scheduler loop keeps calling while the queue cannot move: those passes are
    # skipped (nothing changed). Their cost, as the manager's loop pays it each interval:
    idle = []
    for _ in range(5):
        t = time.perf_counter()
        assert dispatcher.schedule_pass(sm, "default") == []
        idle.append(time.perf_counter() - t)
        assert dispatcher.LAST_PASS["skipped"], "an idle pass was not skipped"
    idle.sort()
    db_cpu_s = backend_cpu()
    # A loop where something changed: one session arrives (the largest regular shape),
    # so the pass runs in full over whatever still waits. With a queue that cannot
    # move this is what a loop costs while sessions keep arriving.
    changed = []
    for i in range(3):
        arrive(sm, f"arrival{i}")
        t = time.perf_counter()
        got = dispatcher.schedule_pass(sm, "default")
        changed.append(time.perf_counter() - t)
        changed_pass = dict(dispatcher.LAST_PASS)
        assert not changed_pass["skipped"], "a pass after an arrival was skipped"
        placed_late = len(got)
    changed.sort()
    # A loop after a release: one placed session ends (its slots given back), so the
    # pass decides the queue again on fresh agents and usage; then the loop after it.
    released, after, released_placed, released_pass = [], [], 0, {}
    for _ in range(3):
        end_one(sm)
        t = time.perf_counter()
        got = dispatcher.schedule_pass(sm, "default")
        released.append(time.perf_counter() - t)
        released_pass = dict(dispatcher.LAST_PASS)
        assert not released_pass["skipped"], "a pass after a release was skipped"
        released_placed += len(got)
        t = time.perf_counter()
        got = dispatcher.schedule_pass(sm, "default")
        after.append(time.perf_counter() - t)
        released_placed += len(got)
    released.sort()
    after.sort()
    # A loop after a cancellation: one waiting session (the oldest) is cancelled.
    cancelled, cancelled_pass = [0.0], {}
    for _ in range(3):
        if not cancel_one(sm):
            break  # nothing waits (everything was placed)
        if cancelled == [0.0]:
            cancelled = []
        t = time.perf_counter()
        got = dispatcher.schedule_pass(sm, "default")
        cancelled.append(time.perf_counter() - t)
        cancelled_pass = dict(dispatcher.LAST_PASS)
        released_placed += len(got)
    cancelled.sort()
    # (in the scheduler's audit module since the third session of 2026-11-30)
    check = getattr(dispatcher, "check_consistency", None)
    if check is None:
        from jupyterhub_backendai.manager.scheduler import check_consistency as check
    problems = check(sm)
    engine.dispose()
    seconds = sum(p["total_s"] for p in passes)
    placing = [p for p in passes if p["placed"]]
    decide = sum(p["decide_s"] for p in placing)
    considered = sum(p["pending"] for p in passes)
    out = dict(
        agents=agents, pending=pending, placed=placed, seconds=seconds,
        placements_per_s=placed / seconds if seconds else 0.0, passes=len(passes),
        setup_s=setup_s, consistent=not problems,
        decide_us_per_placement=1e6 * decide / placed if placed else 0.0,
        decide_us_per_session=1e6 * sum(p["decide_s"] for p in passes) / considered
        if considered else 0.0,
        first_pass=passes[0], last_pass=passes[-1], idle_loop_s=idle[len(idle) // 2],
        waiting=pending - placed, db_cpu_s=db_cpu_s, changed_loop_s=changed[len(changed) // 2],
        changed_loop_pass=changed_pass, changed_loop_placed=placed_late,
        released_loop_s=released[len(released) // 2], released_loop_max_s=released[-1],
        after_release_loop_s=after[len(after) // 2], released_pass=released_pass,
        cancelled_loop_s=cancelled[len(cancelled) // 2], cancelled_pass=cancelled_pass,
        # The pass right after the last one that placed (the queue cannot move then).
        after_placing_loop_s=passes[-1]["total_s"] if len(passes) > 1 else 0.0,
        released_placed=released_placed,
    )
    if verbose:
        for i, p in enumerate(passes):
            cpu = (f"; this process's CPU: load {p['load_cpu_s']:.3f}, decide "
                   f"{p['decide_cpu_s']:.3f}, write {p['write_cpu_s']:.3f}; "
                   f"{p['streamed_batches']} batches written while deciding"
                   if "load_cpu_s" in p else "")
            print(f"  pass {i}: pending={p['pending']} placed={p['placed']} "
                  f"total={p['total_s']:.3f}s (lock {p['lock_s']:.3f}, load {p['load_s']:.3f}, "
                  f"decide {p['decide_s']:.3f}, write {p['write_s']:.3f}, "
                  f"commit {p['commit_s']:.3f}{cpu})")
        print(f"  setup {setup_s:.1f}s; decide {out['decide_us_per_placement']:.1f} us per "
              f"placement, {out['decide_us_per_session']:.1f} us per session considered; "
              f"consistency: {'ok' if not problems else problems[:3]}")
        if db_cpu_s is not None:
            print(f"  the database server's CPU time (the passes' backend process): "
                  f"{db_cpu_s:.2f} s over the passes and idle loops")
        print(f"  idle loop (skipped pass) with {pending - placed} waiting: "
              f"median {out['idle_loop_s']:.4f}s, max {idle[-1]:.4f}s")
        c = out["changed_loop_pass"]
        print(f"  loop after one arrival with {pending - placed} waiting: median "
              f"{out['changed_loop_s']:.4f}s, max {changed[-1]:.4f}s (last: load "
              f"{c.get('load_s', 0):.3f}, decide {c.get('decide_s', 0):.3f}, write "
              f"{c.get('write_s', 0):.3f}; placed {placed_late})")
        r = out["released_pass"]
        print(f"  loop after one session ended: median {out['released_loop_s']:.4f}s, max "
              f"{released[-1]:.4f}s (last: decided {r.get('pending')}, load "
              f"{r.get('load_s', 0):.3f}, decide {r.get('decide_s', 0):.3f}, write "
              f"{r.get('write_s', 0):.3f}{', remembered queue' if r.get('released_only') else ''}"
              f"); the loop after it: median {out['after_release_loop_s']:.4f}s; placed "
              f"{released_placed} over the 3 releases")
        k = out["cancelled_pass"]
        print(f"  loop after one waiting session was cancelled: median "
              f"{out['cancelled_loop_s']:.4f}s, max {cancelled[-1]:.4f}s (last: "
              f"{'remembered queue' if k.get('released_only') else 'full pass'})")
        print(f"  the loop after the last placing pass: {out['after_placing_loop_s']:.4f}s")
    return out


def cancel_one(sm) -> bool:
    """The oldest waiting session is cancelled, as the manager cancels one (False if
    none waits)."""
    return _end(sm, select(Session).where(Session.status == "PENDING").order_by(Session.created_at),
         "CANCELLED", "cancelled by the user", "FAILURE")


def end_one(sm) -> bool:
    """The first placed session (by id) ends, as the manager ends one: its kernels'
    slots are given back to their agents and it is TERMINATED."""
    return _end(sm, select(Session).where(Session.status == "SCHEDULED").order_by(Session.id),
         "TERMINATED", "ended", "SUCCESS")


def _end(sm, which, status: str, info: str, result: str) -> bool:
    with sm.begin() as s:
        sess = s.scalars(which.limit(1)).first()
        if sess is None:
            return False
        writes.release_kernels(s, sess, status)
        writes.set_status(sess, status, info)
        sess.result = result
        sess.alive_marker = None
        sess.terminated_at = utcnow()
    return True


def arrive(sm, name: str) -> None:
    """One new PENDING session of the largest regular shape (16 cores, 64 GiB, 4 GPUs)."""
    with sm.begin() as s:
        row = s.execute(select(Session.user_id, Session.access_key, Session.project_id)
                        .limit(1)).first()
        sid = uuid.uuid4().hex
        per = ResourceSlot({"cpu": 16, "mem": 64 * GiB, "cuda.device": 4})
        s.execute(insert(Session), [dict(
            id=sid, name=name, user_id=row[0], access_key=row[1], domain_name="default",
            project_id=row[2], resource_group="default", image="img", cluster_size=1,
            cluster_mode="single-node", priority=50, requested_slots=per, status="PENDING",
            status_info="waiting for the scheduler",
            status_history={"PENDING": utcnow().isoformat()}, created_at=utcnow(),
            alive_marker=1, designated_agents=[], environ={})])
        s.execute(insert(Kernel), [dict(
            id=uuid.uuid4().hex, session_id=sid, cluster_idx=0, cluster_role="main",
            requested_slots=per, occupied_slots=ResourceSlot(), status="PENDING")])


def _backend_cpu_probe(engine):
    """A function returning the CPU seconds used since now by the PostgreSQL backend
    process that serves this (single-threaded) benchmark's pooled connection, or None
    (SQLite, or a server whose processes this machine cannot see)."""
    if engine.dialect.name != "postgresql":
        return lambda: None
    from sqlalchemy import text

    with engine.connect() as c:
        pid = c.execute(text("SELECT pg_backend_pid()")).scalar()

    def cpu():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    start = cpu()
    return lambda: None if start is None or cpu() is None else cpu() - start


class Databases:
    """Hands out a fresh database per run: SQLite files, a given URL's server, or our own PostgreSQL."""

    def __init__(self, spec: str | None):
        self.spec = spec
        self.tmp = tempfile.mkdtemp(prefix="bai-sched-bench-")
        self.pg = None
        if spec == "postgres":
            from tests.services import Postgres

            self.pg = Postgres()

    def new(self) -> str:
        if self.pg is not None:
            return self.pg.new_database("bench_" + uuid.uuid4().hex[:10])
        if self.spec:
            return self.spec
        return f"sqlite:///{self.tmp}/{uuid.uuid4().hex[:8]}.sqlite"

    def copy(self, url: str) -> str:
        """A new database holding what ``url``'s holds (nothing may be connected to it)."""
        if self.pg is not None:
            name = "bench_" + uuid.uuid4().hex[:10]
            self.pg.psql(f'CREATE DATABASE "{name}" TEMPLATE "{url.rsplit("/", 1)[1]}"')
            return url.rsplit("/", 1)[0] + "/" + name
        if url.startswith("sqlite:///"):
            dst = f"{self.tmp}/{uuid.uuid4().hex[:8]}.sqlite"
            shutil.copyfile(url[len("sqlite:///"):], dst)
            return "sqlite:///" + dst
        raise SystemExit("--baseline needs a database it can copy: SQLite (default) or --db postgres")

    def close(self) -> None:
        if self.pg is not None:
            self.pg.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def compare(dbs: Databases, rev: str, agents: int, pending: int, rounds: int) -> dict:
    """The same populated database, copied for every run, passed by the code of ``rev``
    (``git archive`` into a temporary directory) and by this checkout's, alternately,
    each in its own process: both meet the same machine load, so the ratio holds
    where the absolute seconds do not."""
    import json
    import subprocess

    base = tempfile.mkdtemp(prefix="bai-sched-baseline-", dir=dbs.tmp)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "jupyterhub_backendai"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
    template = dbs.new()
    engine = make_engine(template)
    upgrade(engine)
    t = time.perf_counter()
    populate(make_sessionmaker(engine), agents, pending)
    engine.dispose()
    print(f"populated in {time.perf_counter() - t:.1f}s; baseline {rev} = "
          f"{subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', rev], check=True, capture_output=True, text=True).stdout.strip()}")
    results: dict[str, list] = {"baseline": [], "this": []}
    print("| round | code | load avg | seconds | first pass: load / decide / write | "
          "loop after an arrival (s) | loop after a release (s) | the loop after that (s) | "
          "loop after a cancellation (s) | loop after the last placing pass (s) | "
          "idle loop (s) | database CPU (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in range(rounds):
        for which, code in (("baseline", base), ("this", REPO)):
            url = dbs.copy(template)
            load = os.getloadavg()[0]
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--worker", url,
                 "--agents", str(agents), "--pending", str(pending)],
                env={**os.environ, "BENCH_CODE": code}, capture_output=True, text=True)
            lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if out.returncode or not lines:
                sys.exit(f"{which} run failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
            res = json.loads(lines[-1][len("RESULT "):])
            results[which].append(res)
            f = res["first_pass"]
            db = "" if res["db_cpu_s"] is None else f"{res['db_cpu_s']:.2f}"
            print(f"| {r + 1} | {which} | {load:.1f} | {res['seconds']:.2f} | {f['load_s']:.2f} / "
                  f"{f['decide_s']:.2f} / {f['write_s']:.2f} | {res['changed_loop_s']:.3f} | "
                  f"{res['released_loop_s']:.3f} | {res['after_release_loop_s']:.3f} | "
                  f"{res['cancelled_loop_s']:.3f} | {res['after_placing_loop_s']:.3f} | "
                  f"{res['idle_loop_s']:.4f} | {db} |", flush=True)
            if not res["consistent"]:
                sys.exit(f"{which}: check_consistency failed")

    def med(which, key):
        return statistics.median(x[key] for x in results[which])

    return dict(
        this=results["this"][-1],
        baseline_seconds=med("baseline", "seconds"), seconds=med("this", "seconds"),
        baseline_changed_loop_s=med("baseline", "changed_loop_s"),
        changed_loop_s=med("this", "changed_loop_s"),
        baseline_released_loop_s=med("baseline", "released_loop_s"),
        released_loop_s=med("this", "released_loop_s"),
        baseline_cancelled_loop_s=med("baseline", "cancelled_loop_s"),
        cancelled_loop_s=med("this", "cancelled_loop_s"),
        baseline_after_placing_loop_s=med("baseline", "after_placing_loop_s"),
        after_placing_loop_s=med("this", "after_placing_loop_s"),
    )


def selector_curve(sizes=(100, 1000, 10000, 100000), placements: int = 20000) -> None:
    """The agent index alone (no database): microseconds per selection + commit to the
    index, as agents grow, on agents already partly used, requests for about half the
    free capacity (all fit; a failed search costs more). Shows the per-placement
    cost growing with log(agents), where a scan would grow with agents."""
    try:
        from jupyterhub_backendai.manager.scheduler.pool import AgentPool, PoolAgent
    except ImportError:  # a --baseline from before issue 23
        from jupyterhub_backendai.scheduler.pool import AgentPool, PoolAgent

    rnd = random.Random(7)
    weights = [w for w, *_ in SHAPES]
    print("| agents | µs per placement (concentrated) | µs per placement (dispersed) |")
    print("|---|---|---|")
    for n in sizes:
        row = []
        for pick in ("least_fitting", "most_fitting"):
            agents = []
            for i in range(n):
                gpu = i % 2 == 1
                cap = ResourceSlot({"cpu": 64, "mem": (512 if gpu else 256) * GiB,
                                    **({"cuda.device": 8} if gpu else {})})
                used = ResourceSlot({"cpu": rnd.randrange(0, 33), "mem": rnd.randrange(0, 129) * GiB})
                agents.append(PoolAgent(f"a{i:06d}", "x86_64", cap, used, cap - used))
            pool = AgentPool(agents, ("cuda.device", "cpu", "mem"))
            reqs = []
            for _ in range(min(placements, 4 * n)):  # about half the free capacity
                _, cpu, mem, gpu, _size = rnd.choices(SHAPES, weights)[0]
                reqs.append(ResourceSlot({"cpu": cpu, "mem": mem * GiB,
                                          **({"cuda.device": gpu} if gpu else {})}))
            done = 0
            t = time.perf_counter()
            for need in reqs:
                aid = getattr(pool, pick)(need, None)
                if aid is not None:
                    pool.take(aid, need)
                    done += 1
            row.append(1e6 * (time.perf_counter() - t) / max(done, 1))
        print(f"| {n} | {row[0]:.1f} | {row[1]:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10000)
    ap.add_argument("--db", default=None,
                    help="SQLAlchemy URL of an empty database (it is migrated and filled), or "
                         "'postgres' for a throwaway server (default: a temporary SQLite file)")
    ap.add_argument("--curve", action="store_true",
                    help="agents 100/1,000/10,000 at --pending, then pending 1,000/10,000/"
                         "100,000 at --agents (--max-agents/--max-pending cap the sizes)")
    ap.add_argument("--selector-curve", action="store_true",
                    help="only the in-memory agent index: cost per placement as agents grow")
    ap.add_argument("--max-agents", type=int, default=10000)
    ap.add_argument("--max-pending", type=int, default=100000)
    ap.add_argument("--baseline", metavar="REV",
                    help="also run the code of git revision REV on copies of the same database, "
                         "alternating with this checkout's (--rounds each); the last line gets "
                         "baseline_seconds and ratio")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.selector_curve:
        selector_curve()
        return
    if args.worker:  # one run on a populated database, for --baseline
        import json

        res = run(args.worker, args.agents, args.pending, verbose=False, populated=True)
        print("RESULT " + json.dumps(res, default=str))
        return
    if args.baseline:
        dbs = Databases(args.db)
        try:
            c = compare(dbs, args.baseline, args.agents, args.pending, args.rounds)
        finally:
            dbs.close()
        last = c["this"]
        print(f"agents={last['agents']} pending={last['pending']} placed={last['placed']} "
              f"seconds={c['seconds']:.3f} baseline_seconds={c['baseline_seconds']:.3f} "
              f"ratio={c['seconds'] / c['baseline_seconds']:.3f} "
              f"changed_loop_s={c['changed_loop_s']:.4f} "
              f"baseline_changed_loop_s={c['baseline_changed_loop_s']:.4f} "
              f"released_loop_s={c['released_loop_s']:.4f} "
              f"baseline_released_loop_s={c['baseline_released_loop_s']:.4f} "
              f"cancelled_loop_s={c['cancelled_loop_s']:.4f} "
              f"baseline_cancelled_loop_s={c['baseline_cancelled_loop_s']:.4f} "
              f"after_placing_loop_s={c['after_placing_loop_s']:.4f} "
              f"baseline_after_placing_loop_s={c['baseline_after_placing_loop_s']:.4f} "
              f"waiting={last['waiting']} idle_loop_s={last['idle_loop_s']:.4f}")
        return
    if args.db and args.db not in ("postgres",) and args.curve:
        sys.exit("--curve needs a fresh database per run: use the SQLite default or --db postgres")
    dbs = Databases(args.db)
    try:
        if args.curve:
            rows = []
            for a in (100, 1000, 10000):
                if a <= args.max_agents:
                    print(f"agents={a} pending={args.pending}")
                    rows.append(run(dbs.new(), a, args.pending))
            for p in (1000, 10000, 100000):
                if p <= args.max_pending and p != args.pending:
                    print(f"agents={args.agents} pending={p}")
                    rows.append(run(dbs.new(), args.agents, p))
            print("\n| agents | pending | placed | passes | seconds | placements/s | "
                  "first pass (s): load / decide / write | decide µs per session |")
            print("|---|---|---|---|---|---|---|---|")
            for r in rows:
                f = r["first_pass"]
                print(f"| {r['agents']} | {r['pending']} | {r['placed']} | {r['passes']} | "
                      f"{r['seconds']:.2f} | {r['placements_per_s']:.0f} | "
                      f"{f['total_s']:.2f}: {f['load_s']:.2f} / {f['decide_s']:.2f} / "
                      f"{f['write_s']:.2f} | {r['decide_us_per_session']:.1f} |")
            last = rows[-1]
        else:
            last = run(dbs.new(), args.agents, args.pending)
    finally:
        dbs.close()
    print(f"agents={last['agents']} pending={last['pending']} placed={last['placed']} "
          f"seconds={last['seconds']:.3f} placements_per_s={last['placements_per_s']:.1f} "
          f"waiting={last['waiting']} idle_loop_s={last['idle_loop_s']:.4f} "
          f"changed_loop_s={last['changed_loop_s']:.4f} "
          f"released_loop_s={last['released_loop_s']:.4f} "
          f"cancelled_loop_s={last['cancelled_loop_s']:.4f} "
          f"after_placing_loop_s={last['after_placing_loop_s']:.4f}")


if __name__ == "__main__":
    main()
