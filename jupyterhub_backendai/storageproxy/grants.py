"""Whether the access a transfer token was issued for still holds.

A token dies with its grant, not only when it expires: on every request the handler
(:class:`.transferhandler.TransferHandler`) asks whoever issued the token (the hub's
manager in process, :class:`HubGrants` in the ``backendai-storage-proxy`` daemon),
at most every GRANT_FRESH seconds per token (a tus upload's PATCHes).
"""

from __future__ import annotations

import json
import ssl
import time

import aiohttp

from ..common.errors import BackendAIError, Forbidden, Unauthorized
from .tokens import expired

#: Seconds a "still granted" answer is kept for a token: the longest a token outlives
#: the access it was issued for.
GRANT_FRESH = 2.0
_GRANTED: dict[str, float] = {}  # token -> until when its grant is known to hold


async def still_holds(grants, handler, token: str | None, claims: dict) -> None:
    """Raise the refusal of ``grants(handler, claims)`` unless the grant of ``token``
    was found to hold within the last GRANT_FRESH seconds."""
    if not isinstance(claims.get("user"), str):
        raise Unauthorized("the transfer token names no user; request a new one")
    now = time.monotonic()
    if _GRANTED.get(token, 0.0) < now:
        _GRANTED.pop(token, None)
        await grants(handler, claims)
        if len(_GRANTED) > 10_000:
            _GRANTED.clear()
        _GRANTED[token] = now + GRANT_FRESH


class HubGrants:
    """A daemon's grant check (``grants`` of :class:`.transferhandler.TransferHandler`):
    asks the hub that issued the token (``POST <url>?token=``; 204: it holds). Closed when the hub does not
    answer: 503, never a transfer on an unchecked grant."""

    def __init__(self, url: str, ca: str | None = None):
        self.url = url
        self.ca = ca
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        # aiohttp, as every client of ours (common/httpbase.py): one pool for the checks.
        if self._http is None or self._http.closed:
            ssl_ctx = ssl.create_default_context(cafile=self.ca) if self.ca else None
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_ctx) if ssl_ctx else None,
                timeout=aiohttp.ClientTimeout(total=10))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __call__(self, handler, claims: dict) -> None:
        from urllib.parse import quote

        token = handler.token() or ""
        if expired(claims):
            # A transfer under way past its token's TTL (the handler allowed it): the
            # hub checks tokens' expiry, so it is asked with the same claims signed
            # afresh (this daemon holds the shared secret); it answers on the grant.
            token = handler.tokens.sign({k: v for k, v in claims.items() if k != "exp"},
                                        ttl=60)
        try:
            async with self._session().post(f"{self.url}?token={quote(token)}", data=b"") as r:
                if r.status < 300:
                    return
                if r.status in (401, 403):
                    try:
                        reason = json.loads(await r.read())["title"]
                    except (ValueError, KeyError, TypeError):
                        reason = "the hub says this transfer token's access has ended"
                    raise Forbidden(reason)
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        raise BackendAIError("the hub did not answer whether this transfer may go on; "
                             "try again in a moment", status_code=503)
