"""The record behind keypair authentication (api/keypair_auth.py): a keypair and its
owner read at once, the user's main keypair, the keypairs' usage counters, and the
changes that make a cached lookup stale."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, event, select, update

from ..models import Domain, Keypair, Project, User, project_members
from .ops import reads

# A change to any of these (this process's ORM sessions) makes cached lookups stale.
_WATCHED = (Keypair, User, Domain, Project)


@dataclass(frozen=True)
class KeypairRecord:
    """What keypair authentication needs of a keypair and its owner, read at once."""

    access_key: str
    secret_key: str
    keypair_active: bool
    is_admin: bool
    rate_limit: int
    user_id: str
    username: str
    email: str
    role: str
    user_status: str
    domain_name: str
    domain_active: bool
    allowed_client_ip: tuple[str, ...]
    project_ids: frozenset[str]
    # The owner's main keypair (its rate limit is the user's, whichever key signs).
    main_access_key: str = ""
    main_rate_limit: int = 0


def _main_keypair_query(user_id: str):
    main = getattr(User, "main_access_key", None)
    q = (select(Keypair.access_key, Keypair.rate_limit)
         .where(Keypair.user_id == user_id, Keypair.is_active.is_(True)))
    if main is not None:
        # The user's designated main keypair first, whatever its age.
        q = q.order_by((Keypair.access_key == select(main).where(User.id == user_id)
                        .scalar_subquery()).desc())
    return q.order_by(Keypair.is_default.desc(), Keypair.created_at, Keypair.access_key).limit(1)


@reads
def hub_user_keypair(s, username: str) -> KeypairRecord | None:
    row = s.execute(
        select(User.id, User.username, User.email, User.role, User.status,
               User.allowed_client_ip, User.domain_name)
        .where(User.username == username)
    ).first()
    if row is None:
        return None
    uid, name, email, role, status, allowed_ip, domain = row
    main = s.execute(_main_keypair_query(uid)).first()
    return KeypairRecord(
        access_key=main[0] if main else "", secret_key="", keypair_active=main is not None,
        is_admin=False, rate_limit=int(main[1] or 0) if main else 0, user_id=uid,
        username=name, email=email, role=role, user_status=status, domain_name=domain,
        domain_active=True, allowed_client_ip=tuple(allowed_ip or ()), project_ids=frozenset(),
    )


@reads
def keypair_record(s, access_key: str) -> KeypairRecord | None:
    row = s.execute(
        select(
            Keypair.access_key, Keypair.secret_key, Keypair.is_active, Keypair.is_admin,
            Keypair.rate_limit, User.id, User.username, User.email, User.role, User.status,
            User.allowed_client_ip, Domain.name, Domain.is_active,
        )
        .join(User, Keypair.user_id == User.id)
        .join(Domain, User.domain_name == Domain.name)
        .where(Keypair.access_key == access_key)
    ).first()
    if row is None:
        return None
    (ak, secret, kp_active, is_admin, rate_limit, uid, username, email, role, status,
     allowed_ip, domain, domain_active) = row
    projects = frozenset(s.scalars(
        select(project_members.c.project_id).where(project_members.c.user_id == uid)))
    main = s.execute(_main_keypair_query(uid)).first()
    return KeypairRecord(
        access_key=ak, secret_key=secret, keypair_active=bool(kp_active),
        is_admin=bool(is_admin), rate_limit=int(rate_limit or 0), user_id=uid,
        username=username, email=email, role=role, user_status=status, domain_name=domain,
        domain_active=bool(domain_active), allowed_client_ip=tuple(allowed_ip or ()),
        project_ids=projects, main_access_key=main[0] if main else "",
        main_rate_limit=int(main[1] or 0) if main else 0,
    )


_USAGE_UPDATE = (
    update(Keypair.__table__)
    .where(Keypair.__table__.c.access_key == bindparam("ak"))
    .values(num_queries=Keypair.__table__.c.num_queries + bindparam("n"),
            last_used=bindparam("t"))
)


def write_usage(engine, rows: list[dict]) -> None:
    """Add each keypair's requests and last use: one UPDATE for all of them."""
    # A Core connection, not an ORM session: our own bookkeeping must not empty the cache.
    with engine.begin() as conn:
        conn.execute(_USAGE_UPDATE, rows)


def on_change(sm, callback) -> None:
    """Call ``callback()`` after each flush or bulk statement of ``sm``'s sessions that
    changes a keypair, user, domain or project."""

    def after_flush(session, _flush_context) -> None:
        if any(isinstance(obj, _WATCHED) for obj in (*session.new, *session.dirty, *session.deleted)):
            callback()

    def on_execute(state) -> None:
        if (state.is_update or state.is_delete) and any(
                m.class_ in _WATCHED for m in state.all_mappers):
            callback()

    event.listen(sm, "after_flush", after_flush)
    event.listen(sm, "do_orm_execute", on_execute)
