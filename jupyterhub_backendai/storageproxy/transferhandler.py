"""The base of the transfer handlers: a token's claims, its grant, problem+json errors.

Shared by the tus upload (:mod:`.tus`) and the download (:mod:`.download`) handlers,
and by the hub's grant handler in :mod:`...api.compat`.
"""

from __future__ import annotations

import asyncio
import json
import logging

from tornado import web
from tornado.log import access_log

from ..common.errors import BackendAIError, NotFound, Unauthorized
from .grants import still_holds
from .tokens import EXPIRED, TransferTokens, expired
from .volumes import VFSVolume

TUS_VERSION = "1.0.0"


class TransferHandler(web.RequestHandler):
    """Base: problem+json errors, CORS-free, token-authenticated (no cookies, no XSRF).
    ``initialize(volume, grants)``: ``volume(handler, name)`` gives the :class:`VFSVolume`;
    ``grants(handler, claims)`` (a coroutine function; None: none) asks whoever issued a token
    whether the access it was issued for still holds, on every request: it raises the
    refusal (the user deactivated, the folder unshared, trashed or deleted, the
    permission lowered), so a token dies with its grant, not only when it expires."""

    def initialize(self, volume, grants=None):
        self._volume = volume
        self._grants = grants

    async def claims(self, op: str) -> dict:
        """The claims of this request's valid token for ``op``, whose grant still holds
        (asked at most every GRANT_FRESH seconds per token: a tus upload's PATCHes).
        A token past its TTL passes only for a transfer under way (:meth:`under_way`)."""
        token = self.token()
        claims = self.tokens.check(token, op, expired_ok=True)
        if expired(claims) and not await self.under_way(token, claims):
            raise Unauthorized(EXPIRED)
        if self._grants is not None:
            await still_holds(self._grants, self, token, claims)
        return claims

    async def under_way(self, token: str, claims: dict) -> bool:
        """Whether this request goes on with a transfer its token began within its TTL
        (then the token may be past it). Nothing, here."""
        return False

    def check_xsrf_cookie(self):
        pass  # authenticated by the token in the URL, never by a cookie

    @property
    def tokens(self) -> TransferTokens:
        return TransferTokens.instance(config=self.settings.get("config"))

    def volume(self, claims: dict) -> VFSVolume:
        try:
            vol = self._volume(self, claims.get("vol"))
        except BackendAIError:
            raise NotFound(f"no volume {claims.get('vol')!r} on this storage proxy") from None
        if not isinstance(vol, VFSVolume):
            raise NotFound(f"volume {claims.get('vol')!r} does not take direct transfers")
        return vol

    def token(self) -> str | None:
        values = self.request.query_arguments.get("token")
        return values[-1].decode() if values else None

    def problem(self, e: BackendAIError, headers: dict | None = None) -> None:
        if self._finished:
            return
        self.clear()
        self.set_status(e.status_code)
        for k, v in (headers or {}).items():
            self.set_header(k, v)
        self.set_header("Tus-Resumable", TUS_VERSION)
        self.set_header("Content-Type", "application/problem+json")
        self.finish(problem_json(e))

    def write_error(self, status_code, **kw):
        exc = kw.get("exc_info", (None, None, None))[1]
        if isinstance(exc, BackendAIError):
            self.problem(exc)
        else:
            self.problem(BackendAIError(self._reason or "storage proxy error",
                                        status_code=status_code))

    def log_exception(self, typ, value, tb):
        if isinstance(value, BackendAIError):
            return
        super().log_exception(typ, value, tb)


def problem_json(e: BackendAIError) -> str:
    return json.dumps({
        "type": "https://api.backend.ai/probs/" + {
            400: "invalid-api-params", 401: "auth-failed", 403: "forbidden",
            404: "object-not-found", 409: "conflict", 413: "quota-exceeded",
            416: "invalid-api-params"}.get(e.status_code, "storage-proxy-error"),
        "title": e.title if e.detail == e.title else f"{e.title}: {e.detail}",
        "status": e.status_code, "detail": e.detail, "error": type(e).__name__,
    })


async def small_io(handler: web.RequestHandler, fn, *args):
    """``fn(*args)``, a few metadata calls and at most RAW_MIN bytes of page cache, run
    on the loop's own thread: a hop to a worker thread and back costs more than the
    calls. ``transfer_inline_io=False`` in the application's settings (the daemon's
    ``c.StorageProxyApp.transfer_inline_io``) sends them to a thread, for volumes on a
    file system that can stall (a remote one)."""
    if handler.settings.get("transfer_inline_io", True):
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def log_request(handler: web.RequestHandler) -> None:
    """The daemon's access log: never the query (it holds the token); successes at
    debug level (one line per small file would cost more than serving it)."""
    status = handler.get_status()
    log = access_log.debug if status < 400 else access_log.warning
    if log is access_log.debug and not access_log.isEnabledFor(logging.DEBUG):
        return
    req = handler.request
    log("%d %s %s (%s) %.2fms", status, req.method, req.path, req.remote_ip,
        1000.0 * req.request_time())
