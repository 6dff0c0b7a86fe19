"""Keypair authentication of API requests: Backend.AI's signed requests on the hub.

The API's base handler calls :func:`authenticate` for a request whose
``Authorization`` header starts with ``BackendAI``. It answers who signed it (a
:class:`KeypairPrincipal`) or raises :class:`Unauthorized` with the reason
(malformed header, date outside ±15 minutes, unknown key, wrong signature, a
body that is not the signed one, a signature already used once (a replay),
inactive keypair, user or domain, a client address outside the user's
``allowed_client_ip``) or :class:`TooManyRequests` past the keypair's rate limit.

Requests authenticated by JupyterHub (a token or the login cookie) go through
:func:`authenticate_hub_user`: the same ``allowed_client_ip`` check, and they
count against the rate limit of the user's *main keypair* (``User.main_access_key``
when the model has it, else the user's oldest active keypair, default ones
first), so that neither tokens nor newly minted keypairs escape the limit. Either way the ``X-RateLimit-*`` headers of a counted request are
set on the handler, and also kept in ``handler.sticky_headers`` for the API's
error writer, which re-applies them after tornado's ``send_error`` cleared the
handler's headers (a 429 must carry them).

The signed path is the API's hot path, so it avoids the database where it can:

- Keypair lookups (secret key, flags, the user's role, projects and state, the
  domain's state) are cached for ``KeypairAuth.lookup_cache_ttl`` seconds. Any
  change to a keypair, user, domain or project (membership included) made
  through this process's ORM sessions (the API) empties the cache at once
  (SQLAlchemy flush/execute events), so deactivation takes effect on the next
  request; changes made by other processes are seen within the TTL. The
  principal carries what the API needs to know about the caller, so a signed
  request needs no database round trip before its handler's own.
- ``last_used`` and ``num_queries`` are accumulated in memory and written in
  one executemany UPDATE every ``KeypairAuth.usage_flush_interval`` seconds
  (0: one UPDATE per request). A hub that dies loses at most that much usage.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

from traitlets import Bool, Float, Integer
from traitlets.config import Configurable, LoggingConfigurable

from ..common import signing
from ..common.clientaddr import address_allowed, client_address
from ..common.errors import InvalidRequest, TooManyRequests, Unauthorized
from ..common.types import UserStatus
from ..manager import keypairs
from ..manager.keypairs import KeypairRecord as _KeypairRecord
from ..manager.ratelimit import RateLimitResult, get_rate_limiter, get_signature_memory

log = logging.getLogger(__name__)

_HANDLER_ATTR = "_backendai_ratelimit"


@dataclass(frozen=True)
class KeypairPrincipal:
    """Who signed a request: the keypair and its owner."""

    user_id: str
    username: str
    access_key: str
    is_admin: bool
    rate_limit: int
    role: str = "user"
    domain_name: str = "default"
    email: str = ""
    # The user's projects, so that the API need not load the user again per request.
    project_ids: frozenset[str] = frozenset()


class KeypairAuth(LoggingConfigurable):
    """Settings and state of keypair authentication (one per manager, see :func:`keypair_auth`)."""

    max_clock_skew = Float(
        900.0,
        help="""Seconds a signed request's Date may differ from the hub's clock (Backend.AI:
        15 minutes). Bounds how long a captured request can be replayed.""",
    ).tag(config=True)
    lookup_cache_ttl = Float(
        5.0,
        help="""Seconds a keypair lookup (secret, active flags of keypair, user and domain)
        is reused without asking the database. Changes made through this hub apply at once;
        changes made by other hub processes apply within this time. 0 disables the cache.""",
    ).tag(config=True)
    lookup_cache_size = Integer(
        10000, help="Most keypairs kept in the lookup cache (it is emptied when full)."
    ).tag(config=True)
    usage_flush_interval = Float(
        1.0,
        help="""Seconds between writes of keypairs' last_used and num_queries (one UPDATE
        for all keypairs used in the interval). 0: one UPDATE on every request.""",
    ).tag(config=True)
    rate_limit_window = Float(
        900.0,
        help="""Length in seconds of the sliding window in which a keypair may make
        rate_limit requests (Backend.AI: 900).""",
    ).tag(config=True)
    rate_limit_fail_open = Bool(
        True,
        help="""In cluster mode (rate-limit windows in Redis): when Redis cannot be reached,
        admit signed requests without counting them (and log it) rather than failing
        every API call with a 500.""",
    ).tag(config=True)

    def __init__(self, manager: Any, **kw) -> None:
        if isinstance(manager, Configurable):
            super().__init__(parent=manager, **kw)  # c.KeypairAuth.* from the hub's config
        else:
            super().__init__(**kw)
        self.manager = manager
        self._cache: dict[str, tuple[float, _KeypairRecord | None]] = {}
        self._generation = 0
        self._usage: dict[str, list] = {}
        self._flush_task: asyncio.Task | None = None
        sm = getattr(manager, "sm", None)
        if sm is not None:
            keypairs.on_change(sm, self.invalidate)

    # -- the lookup cache --------------------------------------------------------

    def invalidate(self) -> None:
        """Forget every cached lookup (a keypair, user or domain changed)."""
        self._cache.clear()
        self._generation += 1

    async def lookup(self, access_key: str) -> _KeypairRecord | None:
        return await self._cached(access_key, self.manager.ops.keypair_record, access_key)

    async def _cached(self, key: str, read, *args) -> _KeypairRecord | None:
        """``await read(*args)``, kept under ``key`` for ``lookup_cache_ttl`` seconds."""
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        generation = self._generation
        record = await read(*args)
        # Keep it only if nothing changed while we read (a change empties the cache).
        if self.lookup_cache_ttl > 0 and generation == self._generation:
            if len(self._cache) >= self.lookup_cache_size:
                self._cache.clear()
            self._cache[key] = (now + self.lookup_cache_ttl, record)
        return record

    # -- usage (last_used, num_queries) ------------------------------------------

    async def record_use(self, access_key: str) -> None:
        now = dt.datetime.now(dt.UTC)
        entry = self._usage.get(access_key)
        if entry is None:
            self._usage[access_key] = [1, now]
        else:
            entry[0] += 1
            entry[1] = now
        if self.usage_flush_interval <= 0:
            await self.flush_usage()
        elif self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.usage_flush_interval)
        try:
            await self.flush_usage()
        except Exception:
            log.exception("writing keypair usage failed")

    async def flush_usage(self) -> None:
        """Write the accumulated usage now: one UPDATE statement for all keypairs."""
        if not self._usage:
            return
        batch, self._usage = self._usage, {}
        rows = [{"ak": ak, "n": n, "t": t} for ak, (n, t) in batch.items()]
        await asyncio.to_thread(keypairs.write_usage, self.manager.engine, rows)

    # -- the check ---------------------------------------------------------------

    async def _count(self, handler: Any, access_key: str, limit: int, whose: str) -> None:
        """Count the request against ``access_key``'s window; 429 past ``limit``."""
        if limit <= 0:
            return
        limiter = get_rate_limiter(self.manager, self.rate_limit_window,
                                   self.rate_limit_fail_open)
        result = await limiter.hit(access_key, limit)
        setattr(handler, _HANDLER_ATTR, result)
        headers = ratelimit_headers(handler)
        for name, value in headers.items():
            handler.set_header(name, value)
        # The API's error writer puts these back after tornado clears headers (429s).
        handler.sticky_headers = {**(getattr(handler, "sticky_headers", None) or {}),
                                  **headers}
        if not result.allowed:
            raise TooManyRequests(
                f"{whose} made {limit} requests in the last {int(self.rate_limit_window)} s "
                f"(the rate limit of keypair {access_key}); retry in "
                f"{max(1, int(result.reset + 0.999))} s"
            )

    async def authenticate(self, handler: Any) -> KeypairPrincipal:
        request = handler.request
        skew = dt.timedelta(seconds=self.max_clock_skew)
        signed = signing.read_signed_request(
            request.method, request.uri, request.headers, host=request.host, max_skew=skew,
        )
        streamed = getattr(type(handler), "_stream_request_body", False)
        if streamed and signed.body_sha256 is not None:
            # The body arrives after this check and goes straight to storage.
            raise InvalidRequest(
                f"{signing.BODY_SHA256_HEADER} is not accepted on streamed uploads (the hub "
                "cannot check the hash before it stores the bytes); send the upload without it"
            )
        record = await self.lookup(signed.access_key)
        if record is None:
            raise Unauthorized(f"unknown access key {signed.access_key!r}")
        signed.verify(record.secret_key)
        if not streamed:
            signed.check_body(request.body or b"")
        if not record.keypair_active:
            raise Unauthorized(f"keypair {record.access_key} is inactive")
        if record.user_status != UserStatus.ACTIVE:
            raise Unauthorized(f"user {record.username!r} is not active (status: {record.user_status})")
        if not record.domain_active:
            raise Unauthorized(f"domain {record.domain_name!r} is not active")
        if record.allowed_client_ip:
            _check_client_ip(client_address(handler), record)
        # A signature is good once: remember it while its date is inside the window.
        ttl = (signed.date + skew - dt.datetime.now(dt.UTC)).total_seconds() + 5
        if not await get_signature_memory(self.manager).first_use(
                signed.credential.signature, ttl):
            raise Unauthorized(
                "this signed request was already received once (a replay): sign every "
                "request anew, with its own Date"
            )
        if record.main_access_key and record.main_access_key != record.access_key:
            # A keypair the user minted spends the user's (main keypair's) budget too: k
            # minted keys no longer make k times the user's rate limit. (Its own window
            # is counted last, so the X-RateLimit headers are the signing keypair's.)
            await self._count(handler, record.main_access_key, record.main_rate_limit,
                              f"user {record.username!r}")
        await self._count(handler, record.access_key, record.rate_limit,
                          f"keypair {record.access_key}")
        await self.record_use(record.access_key)
        return KeypairPrincipal(
            user_id=record.user_id, username=record.username, access_key=record.access_key,
            is_admin=record.is_admin, rate_limit=record.rate_limit, role=record.role,
            domain_name=record.domain_name, email=record.email, project_ids=record.project_ids,
        )


    async def hub_user_record(self, username: str) -> _KeypairRecord | None:
        """The record of JupyterHub user ``username`` (client addresses, main keypair),
        cached like keypair lookups (``lookup_cache_ttl``; this hub's changes empty it)."""
        return await self._cached(_USER_KEY + username, self.manager.ops.hub_user_keypair,
                                  username)

    async def authenticate_hub_user(self, handler: Any, username: str) -> None:
        """For a request JupyterHub authenticated (token or cookie) as ``username``: refuse
        a client address outside the user's ``allowed_client_ip`` (401), and count the
        request against the user's main keypair's rate limit (429 past it)."""
        record = await self.hub_user_record(username)
        if record is None:
            return  # no Backend.AI user: the API's principal lookup refuses it
        if record.allowed_client_ip:
            _check_client_ip(client_address(handler), record)
        if record.access_key:
            await self._count(handler, record.access_key, record.rate_limit,
                              f"user {record.username!r}")


# Cache keys of user lookups (usernames cannot contain NUL, access keys neither).
_USER_KEY = "\0user:"


def address_refusal(address: str | None, record: _KeypairRecord | None) -> str | None:
    """Why ``record``'s user may not act from ``address`` (outside their
    ``allowed_client_ip``), in words; None when they may."""
    if record is None or not record.allowed_client_ip:
        return None
    if address_allowed(address, record.allowed_client_ip):
        return None
    return f"client address {address} is not allowed for user {record.username!r}"


def _check_client_ip(remote_ip: str | None, record: _KeypairRecord) -> None:
    why = address_refusal(remote_ip, record)
    if why is not None:
        raise Unauthorized(why)


def keypair_auth(manager: Any) -> KeypairAuth:
    """The manager's :class:`KeypairAuth`, made on first use and kept on the manager."""
    auth = getattr(manager, "_backendai_keypair_auth", None)
    if auth is None:
        auth = KeypairAuth(manager)
        manager._backendai_keypair_auth = auth
    return auth


async def authenticate(manager: Any, handler: Any) -> KeypairPrincipal:
    """Authenticate ``handler``'s signed request; raises Unauthorized / TooManyRequests."""
    return await keypair_auth(manager).authenticate(handler)


async def authenticate_hub_user(manager: Any, handler: Any, username: str) -> None:
    """Client address and rate limit of a token- or cookie-authenticated request."""
    await keypair_auth(manager).authenticate_hub_user(handler, username)


def ratelimit_headers(handler: Any) -> dict[str, str]:
    """The ``X-RateLimit-*`` headers of the handler's request, if it was counted.

    Tornado's ``send_error`` clears headers before ``write_error``; an error writer
    calls this to put them back (a 429 must carry them).
    """
    result: RateLimitResult | None = getattr(handler, _HANDLER_ATTR, None)
    if result is None:
        return {}
    headers = result.headers()
    if not result.allowed:
        headers["Retry-After"] = str(max(1, int(result.reset + 0.999)))
    return headers
