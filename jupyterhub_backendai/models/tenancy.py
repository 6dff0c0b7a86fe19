"""Domains > projects (Backend.AI groups) > users, keypairs and resource policies."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..common.ids import new_id
from ..common.slots import ResourceSlot
from .base import Base, SlotsType, UTCDateTime, pair_table, utcnow

#: A new keypair resource policy's max_pending_session_count (per user, any keypair).
DEFAULT_MAX_PENDING_SESSIONS = 30

project_members = pair_table(
    "project_members", ("project_id", "projects.id"), ("user_id", "users.id"))


class Domain(Base):
    __tablename__ = "domains"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(String(512), default="")
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    allowed_vfolder_hosts: Mapped[dict] = mapped_column(JSON, default=dict)
    allowed_docker_registries: Mapped[list] = mapped_column(JSON, default=list)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class KeypairResourcePolicy(Base):
    __tablename__ = "keypair_resource_policies"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    default_for_unspecified: Mapped[str] = mapped_column(String(16), default="UNLIMITED")
    max_concurrent_sessions: Mapped[int] = mapped_column(Integer, default=30)
    max_containers_per_session: Mapped[int] = mapped_column(Integer, default=1)
    max_session_lifetime: Mapped[int] = mapped_column(Integer, default=0)
    idle_timeout: Mapped[int] = mapped_column(Integer, default=0)
    # Issue 29: seconds an owner may add to a session's max_session_lifetime in all
    # (0: none; sessions.lifetime_extension counts what was added).
    max_lifetime_extension: Mapped[int] = mapped_column(Integer, default=0)
    # Highest scheduling priority (0-100) the keypair's sessions may ask for.
    max_priority: Mapped[int] = mapped_column(Integer, default=100)
    # None: no limit. A new policy (the default one included) starts at
    # DEFAULT_MAX_PENDING_SESSIONS, so that nobody can queue without bound by default.
    max_pending_session_count: Mapped[int | None] = mapped_column(
        Integer, nullable=True, default=DEFAULT_MAX_PENDING_SESSIONS)
    max_pending_session_resource_slots: Mapped[ResourceSlot | None] = mapped_column(
        SlotsType, nullable=True
    )
    allowed_vfolder_hosts: Mapped[dict] = mapped_column(JSON, default=dict)
    # Issue 24: the bounds of each kernel of the keypair's sessions (None: the agent's
    # own, Agent.kernel_pids_limit / Agent.kernel_tmp_size).
    max_pids_per_kernel: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_tmp_size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class _FolderPolicy:
    """What a user's or a project's folders may take (the two policies have the same
    columns, in two tables, as Backend.AI's)."""

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    max_vfolder_count: Mapped[int] = mapped_column(Integer, default=0)
    max_quota_scope_size: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class UserResourcePolicy(_FolderPolicy, Base):
    __tablename__ = "user_resource_policies"


class ProjectResourcePolicy(_FolderPolicy, Base):
    __tablename__ = "project_resource_policies"


class Project(Base):
    """Backend.AI's "group"; mirrored as a JupyterHub group of the same name."""

    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("domain_name", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64))
    domain_name: Mapped[str] = mapped_column(ForeignKey("domains.name", ondelete="RESTRICT"))
    description: Mapped[str] = mapped_column(String(512), default="")
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    total_resource_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    allowed_vfolder_hosts: Mapped[dict] = mapped_column(JSON, default=dict)
    resource_policy: Mapped[str | None] = mapped_column(
        ForeignKey("project_resource_policies.name"), nullable=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)

    members: Mapped[list[User]] = relationship(
        secondary=project_members, back_populates="projects"
    )


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    email: Mapped[str] = mapped_column(String(128), unique=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password: Mapped[str] = mapped_column(String(128))
    full_name: Mapped[str] = mapped_column(String(128), default="")
    status: Mapped[str] = mapped_column(String(32), default="active")
    role: Mapped[str] = mapped_column(String(16), default="user")
    domain_name: Mapped[str] = mapped_column(ForeignKey("domains.name", ondelete="RESTRICT"))
    resource_policy: Mapped[str | None] = mapped_column(
        ForeignKey("user_resource_policies.name"), nullable=True
    )
    need_password_change: Mapped[bool] = mapped_column(Boolean, default=False)
    allowed_client_ip: Mapped[list | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Backend.AI 26.09's ids for the processes of this user's kernels (null: the image's
    # kernel user). Stored and shown; not yet applied by the agents (issue 27).
    container_uid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    container_main_gid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    container_gids: Mapped[list | None] = mapped_column(JSON, nullable=True)

    projects: Mapped[list[Project]] = relationship(
        secondary=project_members, back_populates="members"
    )
    keypairs: Mapped[list[Keypair]] = relationship(back_populates="user")


# Emails compare without case (``manager.tenancy.email_is``): this index serves those
# lookups. (Alembic's autogenerate skips expression indexes; migration 0007 makes it.)
Index("ix_users_email_lower", func.lower(User.email))


class Keypair(Base):
    __tablename__ = "keypairs"

    access_key: Mapped[str] = mapped_column(String(20), primary_key=True)
    secret_key: Mapped[str] = mapped_column(String(40))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    rate_limit: Mapped[int] = mapped_column(Integer, default=1000)
    num_queries: Mapped[int] = mapped_column(BigInteger, default=0)
    last_used: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    resource_policy: Mapped[str] = mapped_column(ForeignKey("keypair_resource_policies.name"))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)

    user: Mapped[User] = relationship(back_populates="keypairs")
