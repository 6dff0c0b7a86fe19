"""Backend.AI's session templates (task templates) and dotfiles (issue 27), kept for the
client API (``/template/session``, ``/user-config/dotfiles``, ``/group-config/dotfiles``,
``/domain-config/dotfiles``; api/compat/templates.py, manager/templates.py)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, Boolean, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from ..common.ids import new_id
from .base import Base, UTCDateTime, utcnow


class SessionTemplate(Base):
    """A task template: a session's options (image, type, resources, folders, environment,
    command) under a name, owned by a user, in a domain and optionally a project."""

    __tablename__ = "session_templates"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128))
    type: Mapped[str] = mapped_column(String(16), default="task")
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    domain_name: Mapped[str] = mapped_column(ForeignKey("domains.name", ondelete="CASCADE"))
    project_id: Mapped[str | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), nullable=True)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    template: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Dotfile(Base):
    """A file written into every new session's home folder of its owner: a user, the
    members of a project (Backend.AI's group), or the users of a domain."""

    __tablename__ = "dotfiles"
    __table_args__ = (UniqueConstraint("owner", "path"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    # "user:<id>", "group:<id>" or "domain:<name>": one key, unique with the path.
    owner: Mapped[str] = mapped_column(String(80))
    user_id: Mapped[str | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), nullable=True)
    project_id: Mapped[str | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), nullable=True)
    domain_name: Mapped[str | None] = mapped_column(
        ForeignKey("domains.name", ondelete="CASCADE"), nullable=True)
    path: Mapped[str] = mapped_column(String(256))
    permission: Mapped[str] = mapped_column(String(4), default="755")
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
