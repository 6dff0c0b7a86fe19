"""Identifiers and Backend.AI-style keypairs."""

from __future__ import annotations

import base64
import secrets
import uuid


def new_id() -> str:
    return uuid.uuid4().hex


def generate_keypair() -> tuple[str, str]:
    """An access key (``AKIA`` + 16 base32 chars) and a 40-character secret key."""
    access = "AKIA" + base64.b32encode(secrets.token_bytes(10)).decode()[:16]
    secret = secrets.token_urlsafe(30)[:40]
    return access, secret
