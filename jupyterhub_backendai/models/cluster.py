"""Resource groups (agent pools) and the agents in them."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, Boolean, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from ..common.slots import ResourceSlot
from .base import Base, SlotsType, UTCDateTime, utcnow


class ResourceGroup(Base):
    """Backend.AI's scaling group."""

    __tablename__ = "resource_groups"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(String(512), default="")
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    is_public: Mapped[bool] = mapped_column(Boolean, default=True)
    scheduler: Mapped[str] = mapped_column(String(32), default="fifo")
    scheduler_opts: Mapped[dict] = mapped_column(JSON, default=dict)
    allowed_domains: Mapped[list] = mapped_column(JSON, default=list)
    allowed_projects: Mapped[list] = mapped_column(JSON, default=list)
    allowed_keypairs: Mapped[list] = mapped_column(JSON, default=list)
    # Scheduler bookkeeping that must survive restarts and be shared by managers
    # (e.g. the round-robin cursor); written only inside a scheduling transaction.
    scheduler_state: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Agent(Base):
    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="ALIVE", index=True)
    resource_group: Mapped[str] = mapped_column(
        ForeignKey("resource_groups.name"), default="default", index=True
    )
    addr: Mapped[str] = mapped_column(String(256), default="")
    architecture: Mapped[str] = mapped_column(String(32), default="x86_64")
    backend: Mapped[str] = mapped_column(String(16), default="docker")
    available_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    occupied_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    schedulable: Mapped[bool] = mapped_column(Boolean, default=True)
    version: Mapped[str] = mapped_column(String(32), default="")
    first_contact: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # What the agent holds, as its last heartbeat said (issues 25 and 30; the scheduler
    # prefers such agents): the labelled images on its engine (None: it did not say), and
    # its ready pooled kernels per warm pool ({pool key: count}).
    images: Mapped[list | None] = mapped_column(JSON, nullable=True, default=None)
    pool_ready: Mapped[dict | None] = mapped_column(JSON, nullable=True, default=None)
    # Its slots another agent of the same host holds now (GPUs of another installation:
    # agent/hostclaims.py), {slot: amount}: the scheduler counts them as taken.
    away_slots: Mapped[dict | None] = mapped_column(JSON, nullable=True, default=None)
