"""When a running session ends by itself, and its owner extending that (issue 29).

A RUNNING session ends when its keypair policy says so (the lifecycle's
``record.past_policy_limits``): its ``max_session_lifetime`` after it began to run,
moved later by what its owner added (``sessions.lifetime_extension``, at most the
policy's ``max_lifetime_extension`` in all), or, an interactive one, ``idle_timeout``
after its last activity. :func:`session_ends` computes those moments by the same rule
for the pages' countdowns and the API; :func:`extend_lifetime` is the one way to move
the lifetime's end, for the owner and those who may manage the session.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select, update

from ..common.errors import Conflict, InvalidRequest
from ..common.types import SessionStatus
from ..models import Keypair, KeypairResourcePolicy, Session, User
from . import access, admin
from .access import Principal
from .ops import reads, writes

BATCH = "batch"


def _utc(t: dt.datetime | str | None) -> dt.datetime | None:
    if t is None:
        return None
    if isinstance(t, str):
        t = dt.datetime.fromisoformat(t)
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def ends_of(sess: Session, policy: KeypairResourcePolicy | None) -> dict:
    """One session's ends as the lifecycle computes them (None: no such end), ISO UTC:
    ``running_since``, ``lifetime_ends``, ``idle_ends``; and the lifetime's seconds
    (``lifetime``, ``extension`` so far, ``extension_left``, ``idle_timeout``)."""
    since = _utc((sess.status_history or {}).get(SessionStatus.RUNNING))
    lifetime = policy.max_session_lifetime if policy is not None else 0
    idle = policy.idle_timeout if policy is not None else 0
    most = policy.max_lifetime_extension if policy is not None else 0
    extension = sess.lifetime_extension or 0
    running = sess.status == SessionStatus.RUNNING and since is not None
    lifetime_ends = idle_ends = None
    if running and lifetime:
        lifetime_ends = since + dt.timedelta(seconds=lifetime + extension)
    if running and idle and sess.session_type != BATCH:
        last = _utc(sess.last_activity)
        idle_ends = max(since, last) + dt.timedelta(seconds=idle) if last else \
            since + dt.timedelta(seconds=idle)
    return {
        "session_id": sess.id,
        "status": sess.status,
        "running_since": _iso(since),
        "lifetime": lifetime,
        "extension": extension,
        "extension_left": max(0, most - extension) if lifetime else 0,
        "lifetime_ends": _iso(lifetime_ends),
        "idle_timeout": idle if sess.session_type != BATCH else 0,
        "idle_ends": _iso(idle_ends),
    }


def _policies(db, access_keys) -> dict[str, KeypairResourcePolicy]:
    """Access key -> its keypair's resource policy row."""
    if not access_keys:
        return {}
    return dict(db.execute(
        select(Keypair.access_key, KeypairResourcePolicy)
        .join(KeypairResourcePolicy, KeypairResourcePolicy.name == Keypair.resource_policy)
        .where(Keypair.access_key.in_(set(access_keys)))).all())


@reads
def session_ends(db, p: Principal, sids: list[str]) -> dict[str, dict]:
    """Session id -> :func:`ends_of`, for the sessions ``p`` may see."""
    if not sids:
        return {}
    rows = list(db.scalars(select(Session).where(Session.id.in_(sids),
                                                 access.session_filter(p))))
    pols = _policies(db, [s.access_key for s in rows])
    return {s.id: ends_of(s, pols.get(s.access_key)) for s in rows}


@reads
def session_lifetime(db, p: Principal, sid: str) -> dict:
    """``GET /sessions/{id}/lifetime``: when the session ends by itself."""
    s = admin._get_session(db, p, sid)
    return ends_of(s, _policies(db, [s.access_key]).get(s.access_key))


def _words(seconds: int) -> str:
    """``90 min``, ``2 h``, ``1 h 30 min``, ``45 s``."""
    s = max(0, int(seconds))
    if s < 60 or s % 60:
        return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"
    m = s // 60
    if m < 60 or m % 60 and m < 120:
        return f"{m} min"
    h, m = divmod(m, 60)
    return f"{h} h {m} min" if m else f"{h} h"


@writes
def extend_lifetime(db, p: Principal, sid: str, seconds: int) -> dict:
    """Move a RUNNING session's lifetime end ``seconds`` later, within what its keypair
    policy allows (``max_lifetime_extension`` in all); refusals in words, nothing
    changed. The caller must be allowed to stop the session (its owner, the admins
    of its domain, superadmins)."""
    s = admin._get_session(db, p, sid)
    access.require(access.can_manage_session(p, s, db.get(User, s.user_id)),
                   f"extend session {s.name!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 1:
        raise InvalidRequest(f"seconds must be a whole number >= 1, not {seconds!r}")
    if s.status != SessionStatus.RUNNING:
        raise Conflict(f"session {s.name!r} is {s.status}: only a running session's "
                       "lifetime is extended")
    policy = _policies(db, [s.access_key]).get(s.access_key)
    name = policy.name if policy is not None else "?"
    if policy is None or not policy.max_session_lifetime:
        raise InvalidRequest(f"session {s.name!r} has no lifetime limit (keypair resource "
                             f"policy {name!r} sets none): there is nothing to extend")
    used = s.lifetime_extension or 0
    left = max(0, policy.max_lifetime_extension - used)
    if left == 0:
        why = ("allows no extension" if not policy.max_lifetime_extension else
               f"allows {_words(policy.max_lifetime_extension)} in all, all of it used")
        raise InvalidRequest(f"session {s.name!r} cannot be extended: keypair resource "
                             f"policy {name!r} {why}")
    if seconds > left:
        raise InvalidRequest(
            f"session {s.name!r} may be extended by at most {_words(left)} more, not "
            f"{_words(seconds)} (keypair resource policy {name!r} allows "
            f"{_words(policy.max_lifetime_extension)} in all; {_words(used)} used)")
    done = db.execute(
        update(Session)
        .where(Session.id == sid, Session.status == SessionStatus.RUNNING,
               Session.lifetime_extension == used)
        .values(lifetime_extension=used + seconds)
        .execution_options(synchronize_session=False)).rowcount
    if not done:
        raise Conflict(f"session {s.name!r} changed meanwhile (ended or extended); "
                       "look again and retry")
    db.refresh(s)
    return ends_of(s, policy)
