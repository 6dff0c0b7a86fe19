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
import json
import queue
import threading
from dataclasses import dataclass, field

from sqlalchemy import bindparam, cast, column, update, values
from sqlalchemy.orm import Session as DBSession

from ...common.types import SessionStatus
from ...models.base import utcnow
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
    #: Writes placements while the pass goes on deciding (PostgreSQL), or None.
    writer: PlacementWriter | None = None
    #: How many of ``placed`` were handed to the writer.
    flushed: int = 0
    #: Request shapes that did not fit (:class:`.pipeline.Shapes` key -> the reason):
    #: free capacity only shrinks within a pass, so they fail again.
    failed_shapes: dict = field(default_factory=dict)
    #: The starvation guard decided a session (placed it or held agents for it): the
    #: next pass may decide differently (the next oldest goes first).
    guarded: bool = False

    def place(self, sess: PendingSession, agents: list[str], pool: AgentPool,
              ctx: PassContext) -> None:
        for (_, slots), aid in zip(sess.kernels, agents, strict=True):
            pool.take(aid, slots)
            self.touched_agents.add(aid)
        if pool.warm:
            pool.took_pooled(sess.image, sess.kernels, agents[0])
        ctx.usage.charge(sess.access_key, sess.user_id, sess.project_id, sess.domain_name,
                         sess.need, in_group=True, new_session=True)
        self.placed.append((sess, agents))
        if self.writer is not None and len(self.placed) - self.flushed >= STREAM_BATCH:
            self.flush()

    def flush(self) -> None:
        """Hand the placements not yet written to the writer."""
        if self.writer is not None and len(self.placed) > self.flushed:
            self.writer.submit(self.placed[self.flushed:])
            self.flushed = len(self.placed)


#: Placements per batch that the writer thread writes while the pass decides on.
STREAM_BATCH = 5000


class PlacementWriter:
    """Writes placed sessions and their kernels in the pass's transaction, from a
    thread, while the pass decides the rest of the queue (PostgreSQL with psycopg2).

    A decision is final once made (free capacity only shrinks within a pass), so
    its rows can be written at once; the database updates them on its own CPU while
    this process decides, instead of after it. Nothing else uses the connection
    meanwhile: the decisions are made in memory. The agents, the waiting and the
    cancelled sessions are written at the end (:func:`commit`), and the transaction
    commits (or rolls everything back) as one.
    """

    def __init__(self, conn, stamp: str):
        self.conn = conn
        self.stamp = stamp
        self.error: BaseException | None = None
        self.batches = 0
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="scheduler-writer", daemon=True)
        self._thread.start()

    @classmethod
    def for_pass(cls, db: DBSession, now: dt.datetime) -> PlacementWriter | None:
        conn = db.connection()
        if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg2":
            return cls(conn, written_at(now).isoformat())
        return None

    def submit(self, batch: list) -> None:
        self._q.put(batch)

    def _run(self) -> None:
        while True:
            batch = self._q.get()
            if batch is None:
                return
            if self.error is not None:
                continue  # the pass fails at finish(); do not write more
            try:
                kernel_rows, session_rows = placement_rows(batch, self.stamp)
                _pg_update_unnest(self.conn, K, "id", list(kernel_rows[0])[1:], kernel_rows)
                _pg_update_unnest(self.conn, S, "id", list(session_rows[0])[1:], session_rows)
                self.batches += 1
            except BaseException as e:  # noqa: BLE001 - handed to the pass's thread
                self.error = e

    def close(self) -> None:
        """Wait until everything submitted was written (or failed)."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()

    def finish(self) -> None:
        self.close()
        if self.error is not None:
            raise self.error


class JSONText(str):
    """A JSON column's value already encoded (written as is on PostgreSQL)."""


def bulk_update(db: DBSession, table, rows: list[dict], key: str = "id") -> None:
    """``UPDATE table SET ... WHERE key = row[key]`` for every row, in few statements."""
    if not rows:
        return
    cols = [c for c in rows[0] if c != key]
    conn = db.connection()
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg2":
        _pg_update_unnest(conn, table, key, cols, rows)
        return
    rows = _decode_json_text(rows)
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


def _decode_json_text(rows: list[dict]) -> list[dict]:
    names = [c for c, v in rows[0].items() if isinstance(v, JSONText)]
    if not names:
        return rows
    out = []
    for r in rows:
        r = dict(r)
        for c in names:
            if isinstance(r[c], JSONText):
                r[c] = json.loads(r[c])
        out.append(r)
    return out


#: Rows per statement on PostgreSQL (each column one array parameter).
PG_CHUNK = 20000


INDEX_JOIN = True
_INDEX_JOIN = "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; "


def _pg_update_unnest(conn, table, key: str, cols: list[str], rows: list[dict]) -> None:
    """``UPDATE t SET c = v.c::type ... FROM unnest(%s::text[], ...) AS v(...) WHERE
    t.key = v.key``: every column travels as one text array parameter, so a chunk of
    20,000 rows is one statement and one round trip whose parameters PostgreSQL parses
    in C (``execute_values`` built and sent 2,000-row ``VALUES`` lists, and converted
    each value through SQLAlchemy's type processors). Values are rendered as the
    columns' bind processors would (JSON encoded once per distinct slot object)."""
    dialect = conn.dialect
    q = dialect.identifier_preparer.quote
    names = [key, *cols]
    casts = [table.c[c].type.compile(dialect=dialect) for c in names]
    convs = [_text_converter(table.c[c].type, dialect) for c in names]
    sets = ", ".join(f"{q(c)} = v.{q(c)}::{t}" for c, t in zip(cols, casts[1:], strict=True))
    arrays = ", ".join("%s::text[]" for _ in names)
    sql = (
        f"UPDATE {q(table.name)} AS t SET {sets} FROM unnest({arrays}) AS v "
        f"({', '.join(q(c) for c in names)}) WHERE t.{q(key)} = v.{q(key)}::{casts[0]}"
    )
    if INDEX_JOIN:
        sql = _INDEX_JOIN + sql
    cur = conn.connection.cursor()
    try:
        for i in range(0, len(rows), PG_CHUNK):
            chunk = rows[i : i + PG_CHUNK]
            params = [
                _array_literal(conv(r[c]) for r in chunk) for c, conv in zip(names, convs, strict=True)
            ]
            cur.execute(sql, params)
    finally:
        cur.close()


def _text_converter(sqltype, dialect):
    """value -> its text for a ``text[]`` element (None: NULL), as the column's
    bind processor renders it."""
    proc = sqltype.bind_processor(dialect)
    memo: dict[int, tuple] = {}

    def conv(v):
        if v is None:
            return None
        if isinstance(v, JSONText):
            return str.__str__(v)
        if isinstance(v, dict):
            # Slot maps are shared by many rows of a pass: encode each object once
            # (the object is kept in the memo, so its id is not reused meanwhile).
            got = memo.get(id(v))
            if got is not None and got[0] is v:
                return got[1]
            x = proc(v) if proc else json.dumps(v)
            memo[id(v)] = (v, x)
            return x
        x = proc(v) if proc else v
        if x is None:
            return None
        if isinstance(x, dt.datetime):
            return x.isoformat()
        if isinstance(x, bool):
            return "true" if x else "false"
        return str(x)

    return conv


def _array_literal(values) -> str:
    """A PostgreSQL array literal of text elements: ``{"a","b",NULL}``."""
    parts = []
    add = parts.append
    for v in values:
        if v is None:
            add("NULL")
        elif "\\" in v or '"' in v:
            add('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            add('"' + v + '"')
    return "{" + ",".join(parts) + "}"


def with_history(sess: PendingSession, status: str, now: dt.datetime) -> dict:
    hist = dict(sess.status_history)
    hist[status] = now.isoformat()
    return hist


def history_text(sess: PendingSession, status: str, stamp: str) -> JSONText:
    """``with_history`` as JSON text. The usual case, a history without ``status``
    that is still the text the database holds, gets the new key appended to that
    text (same object, same key order) instead of a decode and an encode."""
    raw = sess.history_raw
    if isinstance(raw, str) and f'"{status}"' not in raw:
        body = raw.strip()
        if body.startswith("{") and body.endswith("}") and body[1:-1].strip():
            return JSONText(f'{body[:-1].rstrip()}, {json.dumps(status)}: {json.dumps(stamp)}}}')
    hist = dict(sess.status_history)
    hist[status] = stamp
    return JSONText(json.dumps(hist))


def written_at(now: dt.datetime) -> dt.datetime:
    """The time a pass stamps in the histories it writes: the clock after the pass read
    the queue (the pass's ``now`` is taken before, and a session enqueued in between is
    read and may be placed, so its PENDING would follow its SCHEDULED), or ``now`` where
    a caller (a test) put it later."""
    return max(now, utcnow())


def placement_rows(placed: list[tuple[PendingSession, list[str]]], stamp: str):
    """The kernel and session rows of placements: (kernel rows, session rows)."""
    kernel_rows = []
    session_rows = []
    scheduled = SessionStatus.SCHEDULED
    for sess, agents in placed:
        for (kid, slots), aid in zip(sess.kernels, agents, strict=True):
            # The kernel's slots object is shared and never modified: no copy.
            kernel_rows.append(
                {"id": kid, "agent_id": aid, "occupied_slots": slots, "status": scheduled}
            )
        where = agents[0] if len(set(agents)) == 1 else ", ".join(sorted(set(agents)))
        session_rows.append(
            {"id": sess.id, "status": scheduled, "status_info": f"scheduled on {where}",
             "status_history": history_text(sess, scheduled, stamp)}
        )
    return kernel_rows, session_rows


def commit(db: DBSession, alloc: Allocation, pool: AgentPool, ctx: PassContext,
           state_before: dict, told: list | None = None) -> None:
    """Write the pass's decisions (the placements a writer did not write already);
    ``told`` gets ``(id, status)`` of the waiting sessions given a new reason (PENDING)
    and of those cancelled (CANCELLED): :func:`.dispatcher.schedule_pass`."""
    now = ctx.now
    stamp = written_at(now).isoformat()
    kernel_rows, session_rows = placement_rows(alloc.placed[alloc.flushed:], stamp)
    bulk_update(db, K, kernel_rows)
    bulk_update(db, S, session_rows)
    bulk_update(
        db,
        A,
        [{"id": aid, "occupied_slots": pool.agents[aid].occupied.nonzero()}
         for aid in sorted(alloc.touched_agents)],
    )
    reasons = [(s, v) for s, v in alloc.waiting if s.status_info != v.message]
    bulk_update(db, S, [{"id": s.id, "status_info": v.message} for s, v in reasons])
    if told is not None:
        told += [(s.id, SessionStatus.PENDING) for s, _ in reasons]
        told += [(s.id, SessionStatus.CANCELLED) for s, _ in alloc.cancelled]
    if alloc.cancelled:
        bulk_update(
            db, S,
            [{"id": s.id, "status": SessionStatus.CANCELLED, "status_info": v.message,
              "status_history": history_text(s, SessionStatus.CANCELLED, stamp),
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
