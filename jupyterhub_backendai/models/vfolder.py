"""Virtual folders: directories on a storage proxy's volume, owned by a user or a
project, mounted into sessions at ``/home/work/<name>`` and shared with permissions."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from ..common.ids import new_id
from .base import Base, UTCDateTime, utcnow


class VFolder(Base):
    __tablename__ = "vfolders"
    # Names are unique within a quota scope (one user's folders, or one project's).
    __table_args__ = (UniqueConstraint("quota_scope_id", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64))
    # "<storage proxy>:<volume>", e.g. "local:volume1".
    host: Mapped[str] = mapped_column(String(128))
    # "user:<user id>" or "project:<project id>": where the storage counts its bytes.
    quota_scope_id: Mapped[str] = mapped_column(String(64), index=True)
    ownership_type: Mapped[str] = mapped_column(String(16), default="user")
    user_id: Mapped[str | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), nullable=True, index=True
    )
    project_id: Mapped[str | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), nullable=True, index=True
    )
    domain_name: Mapped[str] = mapped_column(ForeignKey("domains.name"))
    creator: Mapped[str] = mapped_column(String(128), default="")
    usage_mode: Mapped[str] = mapped_column(String(16), default="general")
    # The owner's permission (user folders) or every member's (project folders).
    permission: Mapped[str] = mapped_column(String(4), default="rw")
    status: Mapped[str] = mapped_column(String(16), default="provisioning")
    # The folder's own size limit in bytes (None: only its quota scope's applies); never
    # above the scope's limit when set. Backend.AI's ``max_size`` (there in MiB).
    max_size_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)

    shares: Mapped[list[VFolderPermissionRow]] = relationship(
        back_populates="vfolder", cascade="all, delete-orphan", passive_deletes=True
    )


class VFolderPermissionRow(Base):
    """A user folder shared with another user of the same domain."""

    __tablename__ = "vfolder_permissions"

    vfolder_id: Mapped[str] = mapped_column(
        ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    permission: Mapped[str] = mapped_column(String(4), default="ro")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)

    vfolder: Mapped[VFolder] = relationship(back_populates="shares")


class VFolderInvitation(Base):
    """An offer to share a user folder, which the invitee accepts (a share is made with
    its permission) or declines; the inviter may withdraw it while it is pending."""

    __tablename__ = "vfolder_invitations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    vfolder_id: Mapped[str] = mapped_column(
        ForeignKey("vfolders.id", ondelete="CASCADE"), index=True
    )
    inviter_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    invitee_id: Mapped[str] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    permission: Mapped[str] = mapped_column(String(4), default="ro")
    # pending, accepted, rejected, canceled
    state: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    modified_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
