"""Warm pools (issue 30): per resource group, how many kernels of an image and a preset
are kept started and unassigned (manager/warmpool.py, docs/architecture.md)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime, utcnow


class WarmPool(Base):
    __tablename__ = "warm_pools"

    resource_group: Mapped[str] = mapped_column(
        ForeignKey("resource_groups.name", ondelete="CASCADE"), primary_key=True)
    image: Mapped[str] = mapped_column(String(256), primary_key=True)
    preset: Mapped[str] = mapped_column(
        ForeignKey("resource_presets.name", ondelete="CASCADE"), primary_key=True)
    # Kernels kept started and unassigned; 0: none (the pool is off).
    size: Mapped[int] = mapped_column(Integer, default=0)
    # Why the pool is not full ("" when it is, or filling): shown in the console.
    status_info: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
