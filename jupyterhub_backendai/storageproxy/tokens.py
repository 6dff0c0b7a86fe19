"""The tokens of direct transfers: signed by the manager, checked by the storage proxy.

A token (HMAC-SHA256 over its JSON claims, with a secret the manager and the proxies
share) names one file of one folder, the operation and, for an upload, the size and an
upload id; see :mod:`.transfer` for what the proxy does with it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time

from traitlets import Integer, Unicode, default
from traitlets.config import SingletonConfigurable

from ..common.errors import Forbidden, Unauthorized
from .paths import check_ids


class TransferTokens(SingletonConfigurable):
    """Signs and checks the tokens of direct transfers (HMAC-SHA256)."""

    secret = Unicode(
        help="""Secret shared by the manager and the storage proxies to sign transfer
        tokens (env BACKENDAI_TRANSFER_SECRET). The default, a random one per process,
        fits the embedded proxy; set the same value on the hub and every
        backendai-storage-proxy in cluster mode.""",
    ).tag(config=True)

    @default("secret")
    def _secret_default(self):
        return os.environ.get("BACKENDAI_TRANSFER_SECRET") or secrets.token_hex(32)

    ttl = Integer(
        300,
        help="""Seconds in which a transfer token may *start* a transfer: a new download
        (or a resumed one whose earlier request has ended more than DOWNLOAD_RESUME
        seconds ago), a new tus upload. It does not cut a transfer under way: a download
        that is answering runs to its end, and a tus upload created within it keeps
        taking PATCHes (and HEADs) past it while they keep coming (see
        ``upload_idle``). Every request, within the TTL or past it, is also refused
        once the token's grant ends (the user, the folder, the permission). Clients get
        a new token by asking again (``request-upload``/``request-download``, which
        check the access afresh); Backend.AI's clients ask per file.""",
    ).tag(config=True)

    upload_idle = Integer(
        3600,
        help="""Seconds an unfinished tus upload lives without a write: past its token's
        ``ttl`` it may still be resumed with the same token until then (its grant still
        holding); then its staged bytes are removed (swept at most once a minute, when
        an upload starts in the same quota scope) and the token is of no more use.""",
    ).tag(config=True)

    def _mac(self, data: bytes) -> bytes:
        return hmac.digest(self.secret.encode(), data, hashlib.sha256)

    def sign(self, claims: dict, ttl: int | None = None) -> str:
        body = dict(claims, exp=int(time.time()) + (self.ttl if ttl is None else ttl))
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(raw)}.{_b64(self._mac(raw))}"

    def check(self, token: str | None, op: str | None, *, expired_ok: bool = False) -> dict:
        """The claims of a valid, unexpired token for ``op`` (None: an upload or a
        download token); else 401 with the reason. ``expired_ok``: a token past its
        ``exp`` passes too (the caller then allows only a transfer under way, see
        :meth:`TransferHandler.claims`)."""
        if not token:
            raise Unauthorized("a transfer token is required (?token=...)")
        try:
            raw_b64, mac_b64 = token.split(".")
            raw, mac = _unb64(raw_b64), _unb64(mac_b64)
        except ValueError:
            raise Unauthorized("the transfer token is malformed") from None
        if not hmac.compare_digest(mac, self._mac(raw)):
            raise Unauthorized("the transfer token's signature is not valid")
        try:
            claims = json.loads(raw)
        except ValueError:
            raise Unauthorized("the transfer token is malformed") from None
        if not isinstance(claims, dict) or claims.get("op") != (op or claims.get("op")) or \
                claims.get("op") not in ("upload", "download"):
            raise Forbidden(f"this transfer token is not for {op or 'a transfer'}")
        if not isinstance(claims.get("exp"), int) or \
                (claims["exp"] < time.time() and not expired_ok):
            raise Unauthorized(EXPIRED)
        check_ids(claims.get("scope"), claims.get("folder"))
        return claims


EXPIRED = "the transfer token has expired; request a new one"


def expired(claims: dict) -> bool:
    return claims["exp"] < time.time()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def upload_claims(volume: str, scope: str, folder: str, path: str, size: int,
                  user: str | None = None) -> dict:
    """An upload's claims; ``user``: who the grant is for (checked again on every
    request, see :class:`TransferHandler`)."""
    return {"op": "upload", "vol": volume, "scope": scope, "folder": folder, "path": path,
            "size": int(size), "id": secrets.token_hex(16), "user": user}


def download_claims(volume: str, scope: str, folder: str, path: str,
                    user: str | None = None) -> dict:
    return {"op": "download", "vol": volume, "scope": scope, "folder": folder, "path": path,
            "user": user}
