"""The API's lists of a user's sessions, answered from memory and kept current by changes.

``GET /hub/api/backendai/sessions`` of a plain user (not a superadmin, not a domain
reader) is the API's hottest read: clients poll it. :class:`SessionLists` keeps each
polled user's sessions as the API serialises them (``responses.Session``, in the
API's order) and answers filters and pages from that copy. An entry is dropped

- when this process commits a change to one of the user's sessions or their kernels
  (SQLAlchemy ``after_flush`` collects what changed, ``after_commit`` drops it: a
  read racing the commit is not kept, see the generation below);
- on every session change event: this manager's own (``changed``, a scheduler
  pass's placements) and other managers' ``session_changed`` broadcasts (Redis in
  cluster mode); a broadcast for a session not in memory, or a gap in the bus (Redis
  restarted), drops every entry;
- at the latest ``session_list_ttl`` seconds (the manager's setting) after it was
  read: a safety net, as the waiters' slow poll is, for what changes without an
  event (a write of another process whose broadcast was lost, bulk statements that
  bypass the ORM).

A load that started before an invalidation is not kept (a generation counter), so an
entry never holds a state older than the last change this process heard of. Users
with more than ``max_sessions`` sessions, and admins' wider lists, are read from the
database every time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import event, func, select
from sqlalchemy.orm import selectinload

from ..models import Kernel, Session
from . import access, admin, responses

# Filters of GET /sessions and the Session body's field each one compares.
FILTER_FIELDS = {"status": "status", "user_id": "user_id", "project_id": "project_id",
                 "type": "type"}
_INFO_KEY = "bai_session_lists"


def _load(db, user_id: str, cap: int) -> list[dict] | None:
    """The user's sessions as the API shows them, in its order; None past ``cap``."""
    if db.scalar(select(func.count()).select_from(Session).where(Session.user_id == user_id)) > cap:
        return None
    stmt = (select(Session).where(Session.user_id == user_id)
            .options(selectinload(Session.kernels), selectinload(Session.dependencies))
            .order_by(Session.created_at, Session.id))
    return responses.Session.bodies(db.scalars(stmt).unique())


class SessionLists:
    def __init__(self, manager: Any, *, max_sessions: int = 1000, max_users: int = 10000) -> None:
        self.manager = manager  # its session_list_ttl is read on every load (it may change)
        self.max_sessions = max_sessions
        self.max_users = max_users
        self._entries: dict[str, tuple[float, list[dict]]] = {}  # user id -> (expiry, items)
        self._owner: dict[str, str] = {}  # session id -> user id, for the entries held
        self._lock = threading.Lock()  # commits invalidate from the database threads
        self._generation = 0
        self.loads = 0  # database reads made for entries (tests, metrics)

    # -- keeping current -----------------------------------------------------------

    def attach(self, sessionmaker) -> None:
        """Follow the commits made through ``sessionmaker`` (the manager's writer)."""
        event.listen(sessionmaker, "after_flush", self._after_flush)
        event.listen(sessionmaker, "after_commit", self._after_commit)
        event.listen(sessionmaker, "after_soft_rollback", self._after_rollback)
        event.listen(sessionmaker, "do_orm_execute", self._on_execute)

    def _after_flush(self, session, _ctx) -> None:
        changed = session.info.setdefault(_INFO_KEY, set())
        for obj in (*session.new, *session.dirty, *session.deleted):
            if isinstance(obj, Session):
                changed.add(("user", obj.user_id))
            elif isinstance(obj, Kernel):
                changed.add(("session", obj.session_id))

    def _on_execute(self, state) -> None:
        if (state.is_update or state.is_delete or state.is_insert) and any(
                m.class_ in (Session, Kernel) for m in state.all_mappers):
            state.session.info.setdefault(_INFO_KEY, set()).add(("all", None))

    def _after_commit(self, session) -> None:
        changed = session.info.pop(_INFO_KEY, None)
        if not changed:
            return
        for kind, key in changed:
            if kind == "all":
                self.invalidate_all()
                return
            if kind == "user":
                self.invalidate(key)
            else:
                self.session_changed(key)

    def _after_rollback(self, session, _previous) -> None:
        session.info.pop(_INFO_KEY, None)

    def session_changed(self, sid: str | None) -> None:
        """Session ``sid`` changed (None: any may have)."""
        user = self._owner.get(sid) if sid is not None else None
        if user is None:
            # Not held (a new session, or one of a user not polled): the owner is not
            # known here, so nothing held can be trusted to include it.
            if sid is None or self._entries:
                self.invalidate_all()
            return
        self.invalidate(user)

    def invalidate(self, user_id: str) -> None:
        with self._lock:
            self._generation += 1
            entry = self._entries.pop(user_id, None)
            if entry is not None:
                for item in entry[1]:
                    self._owner.pop(item["id"], None)

    def invalidate_all(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()
            self._owner.clear()

    # -- answering -----------------------------------------------------------------

    @staticmethod
    def cacheable(p: access.Principal) -> bool:
        return not (p.is_superadmin or p.reads_domain)

    async def page(self, p: access.Principal, filters: dict, offset: int, limit: int) -> dict:
        """What ``admin.list_sessions`` answers, from memory where it can."""
        items = await self._items(p) if self.cacheable(p) else None
        if items is None:
            return await self.manager.db_read(admin.list_sessions, p, filters, offset, limit)
        if filters:
            checks = [(FILTER_FIELDS[k], v) for k, v in filters.items()]
            items = [it for it in items if all(it[f] == v for f, v in checks)]
        return {"items": items[offset:offset + limit], "total": len(items),
                "offset": offset, "limit": limit}

    async def _items(self, p: access.Principal) -> list[dict] | None:
        now = time.monotonic()
        entry = self._entries.get(p.user_id)
        if entry is not None and entry[0] > now:
            return entry[1]
        generation = self._generation
        items = await self.manager.db_read(_load, p.user_id, self.max_sessions)
        self.loads += 1
        ttl = self.manager.session_list_ttl
        if items is None or ttl <= 0:
            return items
        with self._lock:
            if generation == self._generation:  # nothing changed while it was read
                if len(self._entries) >= self.max_users:
                    self._entries.clear()
                    self._owner.clear()
                self._entries[p.user_id] = (now + ttl, items)
                for item in items:
                    self._owner[item["id"]] = p.user_id
        return items
