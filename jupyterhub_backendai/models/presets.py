"""Resource presets (Backend.AI's ``resource_presets``): named bundles of resource slots
the spawn form offers as cards, optionally only in one resource group."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from ..common.slots import ResourceSlot
from .base import Base, SlotsType, UTCDateTime, utcnow


class ResourcePreset(Base):
    __tablename__ = "resource_presets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(String(512), default="")
    resource_slots: Mapped[ResourceSlot] = mapped_column(SlotsType, default=ResourceSlot)
    # Offered only in this resource group; None: in every group.
    resource_group: Mapped[str | None] = mapped_column(
        ForeignKey("resource_groups.name", ondelete="CASCADE"), nullable=True, index=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
