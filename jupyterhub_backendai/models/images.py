"""Kernel images: the container registries they come from, and the catalogue (issue 25).

A registry is configuration (Backend.AI keeps it in etcd; here in the record): where it
is, which project (namespace) of it is ours, and the credentials agents pull with. The
password is a secret: no API answer carries it, no log line names it.

The catalogue holds one row per image reference (``<registry host>/<repo>:<tag>``, or a
locally built image's own name for the source ``local``) with the labels its rescan
read (``ai.backend.*``); admins hide an image, describe it, mark one the default and
give it aliases.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime, utcnow


class ContainerRegistry(Base):
    __tablename__ = "container_registries"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # https://host[:port]; images are named "<host[:port]>/<project>/<repo>:<tag>".
    url: Mapped[str] = mapped_column(String(512))
    # The namespace of the registry this installation uses ("" = every repository).
    project: Mapped[str] = mapped_column(String(128), default="")
    username: Mapped[str] = mapped_column(String(128), default="")
    password: Mapped[str] = mapped_column(String(512), default="")
    # PEM of a CA to trust for the rescan (the agents' engines trust it by their own
    # configuration, /etc/docker/certs.d); empty: the system's CAs.
    ca_cert: Mapped[str] = mapped_column(Text, default="")
    # Backend.AI's auto_pull: "digest" (pull when the tag points at a new digest),
    # "tag" (pull when the tag is missing), "none" (never pull).
    pull_policy: Mapped[str] = mapped_column(String(16), default="tag")
    last_scan: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Image(Base):
    __tablename__ = "images"

    # The reference an engine pulls or runs: "127.0.0.1:5000/lab/python:3.11".
    name: Mapped[str] = mapped_column(String(512), primary_key=True)
    # A registry's name, or "local" for images built on the agents' engines.
    source: Mapped[str] = mapped_column(String(64), index=True)
    repo: Mapped[str] = mapped_column(String(256))
    tag: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(128), default="")
    architecture: Mapped[str] = mapped_column(String(32), default="x86_64")
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    labels: Mapped[dict] = mapped_column(JSON, default=dict)
    description: Mapped[str] = mapped_column(String(512), default="")
    hidden: Mapped[bool] = mapped_column(Boolean, default=False)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    # This image's pull policy ("digest", "tag", "none"); null: its registry's.
    pull_policy: Mapped[str | None] = mapped_column(String(16), nullable=True)
    scanned_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # A session committed to an image (``session commit``): its owner's only (a user id);
    # null: the installation's.
    owner_id: Mapped[str | None] = mapped_column(String(32), nullable=True)


class ImageAlias(Base):
    __tablename__ = "image_aliases"

    alias: Mapped[str] = mapped_column(String(256), primary_key=True)
    image: Mapped[str] = mapped_column(
        ForeignKey("images.name", ondelete="CASCADE"), index=True
    )
