"""Compute sessions and their kernels (containers)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..common.ids import new_id
from ..common.slots import ResourceSlot
from .base import Base, SlotsType, UTCDateTime, pair_table, utcnow

session_dependencies = pair_table(
    "session_dependencies", ("session_id", "sessions.id"), ("depends_on", "sessions.id"))


class Session(Base):
    __tablename__ = "sessions"
    __table_args__ = (UniqueConstraint("access_key", "name", "alive_marker"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64))
    session_type: Mapped[str] = mapped_column(String(16), default="interactive")
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    # Indexed by the unique (access_key, name, alive_marker): its leading column.
    access_key: Mapped[str] = mapped_column(ForeignKey("keypairs.access_key"))
    domain_name: Mapped[str] = mapped_column(ForeignKey("domains.name"))
    project_id: Mapped[str | None] = mapped_column(ForeignKey("projects.id"), nullable=True)
    resource_group: Mapped[str] = mapped_column(ForeignKey("resource_groups.name"), index=True)
    image: Mapped[str] = mapped_column(String(512))
    cluster_size: Mapped[int] = mapped_column(Integer, default=1)
    cluster_mode: Mapped[str] = mapped_column(String(16), default="single-node")
    priority: Mapped[int] = mapped_column(Integer, default=50)
    requested_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    status: Mapped[str] = mapped_column(String(16), default="PENDING", index=True)
    status_info: Mapped[str] = mapped_column(Text, default="")
    status_history: Mapped[dict] = mapped_column(JSON, default=dict)
    # Set while the session is alive, NULL once dead: keeps names unique among live sessions only.
    alive_marker: Mapped[int | None] = mapped_column(Integer, nullable=True, default=1)
    environ: Mapped[dict] = mapped_column(JSON, default=dict)
    service_prefix: Mapped[str] = mapped_column(String(512), default="/")
    retries: Mapped[int] = mapped_column(Integer, default=0)
    # Batch sessions (API only): the command run to completion, and how long it may take.
    startup_command: Mapped[str | None] = mapped_column(Text, nullable=True)
    batch_timeout: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Not scheduled before this time (batch sessions booked for later).
    starts_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Agent architecture the kernels need (None: any), and agents the owner pinned it to.
    architecture: Mapped[str | None] = mapped_column(String(32), nullable=True)
    designated_agents: Mapped[list] = mapped_column(JSON, default=list)
    # Virtual folders mounted into every kernel, resolved at enqueue:
    # [{"id", "name", "host", "quota_scope_id", "permission", "target"}].
    vfolder_mounts: Mapped[list] = mapped_column(JSON, default=list)
    # UNDEFINED while alive; SUCCESS or FAILURE once dead (dependencies wait for SUCCESS).
    result: Mapped[str] = mapped_column(String(16), default="UNDEFINED")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    terminated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Newest activity known (the hub's record of the user's server): the keypair
    # policy's idle_timeout counts from here, or from RUNNING when never set.
    last_activity: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Issue 29: seconds its owner added to the keypair policy's max_session_lifetime (at
    # most the policy's max_lifetime_extension): the lifetime ends that much later.
    lifetime_extension: Mapped[int] = mapped_column(Integer, default=0)
    # The lifecycle's claim (manager/lifecycle/claims.py): the manager process driving the
    # session's current step (a start, a destroy) and until when; an expired or dead
    # owner's claim is taken over, so no step depends on a process that died.
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The status a TERMINATING session ends in (any manager may finish the destroy).
    end_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # While a JupyterHub spawner waits for this session (its start() renews it, and the
    # first poll() after the start clears it): past it, JupyterHub no longer knows the
    # session (the hub died or gave up) and it is ended.
    awaited_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)

    kernels: Mapped[list[Kernel]] = relationship(
        back_populates="session", order_by="Kernel.cluster_idx"
    )
    dependencies: Mapped[list[Session]] = relationship(
        secondary=session_dependencies,
        primaryjoin=lambda: Session.id == session_dependencies.c.session_id,
        secondaryjoin=lambda: Session.id == session_dependencies.c.depends_on,
    )


class Kernel(Base):
    __tablename__ = "kernels"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    session_id: Mapped[str] = mapped_column(
        ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    cluster_role: Mapped[str] = mapped_column(String(16), default="main")
    cluster_idx: Mapped[int] = mapped_column(Integer, default=0)
    cluster_hostname: Mapped[str] = mapped_column(String(64), default="main1")
    agent_id: Mapped[str | None] = mapped_column(ForeignKey("agents.id"), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(16), default="PENDING", index=True)
    requested_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    # What this kernel holds on its agent right now: zero unless placed and not yet freed.
    occupied_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    container_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    kernel_host: Mapped[str | None] = mapped_column(String(256), nullable=True)
    service_ports: Mapped[list] = mapped_column(JSON, default=list)
    attached_devices: Mapped[dict] = mapped_column(JSON, default=dict)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Output of a batch kernel, kept after its container is gone (tail, bounded by the agent).
    logs: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    terminated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The agent's time (Unix seconds) of the last live sample counted in kernel_usage.
    usage_sampled_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    session: Mapped[Session] = relationship(back_populates="kernels")
