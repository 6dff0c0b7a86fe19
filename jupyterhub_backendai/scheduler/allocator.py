"""The allocator: commits a pass's decisions in the pass's transaction, in bulk.

Placing a session means, at once: its kernels get an agent and occupied slots,
the agents' occupied slots grow by exactly that, the session becomes SCHEDULED.
The pass records these in memory (:class:`Allocation`) and writes them with one
statement per table and chunk (``UPDATE ... FROM (VALUES ...)`` on PostgreSQL,
``executemany`` on SQLite), inside the same transaction that read the state and
holds the locks, so that a crash or a rollback leaves no half placement.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import bindparam, cast, column, update, values
from sqlalchemy.orm import Session as DBSession

from ..common.slots import ResourceSlot
from ..common.types import SessionStatus
from .pool import AgentPool
from .snapshot import RG, A, K, S
from .state import PassContext, PendingSession, Verdict

CHUNK = 2000


@dataclass
class Allocation:
    placed: list[tuple[PendingSession, list[str]]] = field(default_factory=list)
    #: Sessions that stay PENDING with a reason (the verdict).
    waiting: list[tuple[PendingSession, Verdict]] = field(default_factory=list)
    cancelled: list[tuple[PendingSession, Verdict]] = field(default_factory=list)
    touched_agents: set[str] = field(default_factory=set)

    def place(self, sess: PendingSession, agents: list[str], pool: AgentPool,
              ctx: PassContext) -> None:
        for (_, slots), aid in zip(sess.kernels, agents, strict=True):
            pool.take(aid, slots)
            self.touched_agents.add(aid)
        ctx.usage.charge(sess.access_key, sess.user_id, sess.project_id, sess.domain_name,
                         sess.need, in_group=True, new_session=True)
        self.placed.append((sess, agents))


def bulk_update(db: DBSession, table, rows: list[dict], key: str = "id") -> None:
    """``UPDATE table SET ... WHERE key = row[key]`` for every row, in few statements."""
    if not rows:
        return
    cols = [c for c in rows[0] if c != key]
    conn = db.connection()
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg2":
        _pg_execute_values(conn, table, key, cols, rows)
        return
    if conn.dialect.name == "postgresql":
        for i in range(0, len(rows), CHUNK):
            chunk = rows[i : i + CHUNK]
            v = values(
                column(key, table.c[key].type),
                *[column(c, table.c[c].type) for c in cols],
                name="v",
            ).data([tuple(r[c] for c in (key, *cols)) for r in chunk])
            conn.execute(
                update(table)
                .where(table.c[key] == v.c[key])
                .values({c: cast(v.c[c], table.c[c].type) for c in cols})
            )
        return
    stmt = (
        update(table)
        .where(table.c[key] == bindparam("b__key", type_=table.c[key].type))
        .values({c: bindparam("b_" + c, type_=table.c[c].type) for c in cols})
    )
    conn.execute(stmt, [{"b__key": r[key], **{"b_" + c: r[c] for c in cols}} for r in rows])


def _pg_execute_values(conn, table, key: str, cols: list[str], rows: list[dict]) -> None:
    """psycopg2's ``execute_values``: one ``UPDATE ... FROM (VALUES ...)`` per page,
    values converted by the columns' own SQLAlchemy types, then cast in SQL."""
    from psycopg2.extras import execute_values

    dialect = conn.dialect
    q = dialect.identifier_preparer.quote
    names = [key, *cols]
    procs = [table.c[c].type.bind_processor(dialect) for c in names]
    casts = [table.c[c].type.compile(dialect=dialect) for c in names]
    sets = ", ".join(f"{q(c)} = v.{q(c)}::{t}" for c, t in zip(cols, casts[1:], strict=True))
    sql = (
        f"UPDATE {q(table.name)} AS t SET {sets} FROM (VALUES %s) AS v "
        f"({', '.join(q(c) for c in names)}) WHERE t.{q(key)} = v.{q(key)}::{casts[0]}"
    )
    data = [
        tuple(p(r[c]) if p else r[c] for c, p in zip(names, procs, strict=True)) for r in rows
    ]
    cur = conn.connection.cursor()
    try:
        execute_values(cur, sql, data, page_size=CHUNK)
    finally:
        cur.close()


def with_history(sess: PendingSession, status: str, now: dt.datetime) -> dict:
    hist = dict(sess.status_history)
    hist[status] = now.isoformat()
    return hist


def commit(db: DBSession, alloc: Allocation, pool: AgentPool, ctx: PassContext,
           state_before: dict) -> None:
    now = ctx.now
    kernel_rows = []
    session_rows = []
    for sess, agents in alloc.placed:
        for (kid, slots), aid in zip(sess.kernels, agents, strict=True):
            kernel_rows.append(
                {"id": kid, "agent_id": aid, "occupied_slots": ResourceSlot(slots),
                 "status": SessionStatus.SCHEDULED}
            )
        where = sorted(set(agents))
        session_rows.append(
            {"id": sess.id, "status": SessionStatus.SCHEDULED,
             "status_info": f"scheduled on {', '.join(where)}",
             "status_history": with_history(sess, SessionStatus.SCHEDULED, now)}
        )
    bulk_update(db, K, kernel_rows)
    bulk_update(db, S, session_rows)
    bulk_update(
        db,
        A,
        [{"id": aid, "occupied_slots": pool.agents[aid].occupied.nonzero()}
         for aid in sorted(alloc.touched_agents)],
    )
    bulk_update(
        db, S,
        [{"id": s.id, "status_info": v.message} for s, v in alloc.waiting
         if s.status_info != v.message],
    )
    if alloc.cancelled:
        bulk_update(
            db, S,
            [{"id": s.id, "status": SessionStatus.CANCELLED, "status_info": v.message,
              "status_history": with_history(s, SessionStatus.CANCELLED, now),
              "alive_marker": None, "terminated_at": now, "result": "FAILURE"}
             for s, v in alloc.cancelled],
        )
        bulk_update(
            db, K,
            [{"id": kid, "status": SessionStatus.CANCELLED, "terminated_at": now}
             for s, _ in alloc.cancelled for kid, _slots in s.kernels],
        )
    if ctx.group.scheduler_state != state_before:
        db.execute(
            update(RG).where(RG.c.name == ctx.group.name)
            .values(scheduler_state=ctx.group.scheduler_state)
        )
