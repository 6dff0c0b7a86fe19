"""Backend.AI's keypair request signing (HMAC-SHA256), for clients and for the server.

A client holding an access key and a secret key signs each request; the server,
which stores the secret key, recomputes the signature. Nothing secret travels:
the ``Authorization`` header carries only the access key and the signature::

    Authorization: BackendAI signMethod=HMAC-SHA256, credential=<access key>:<signature>

The signed string is seven lines joined by ``\\n``::

    METHOD                      (upper case)
    /path?query                 (exactly as sent on the request line)
    <Date or X-BackendAI-Date header value, verbatim>
    host:<Host header, with the port if the client sent one>
    content-type:<media type, lower case, without parameters>
    x-backendai-version:<X-BackendAI-Version header>
    <hex SHA-256 of the EMPTY byte string>

The seventh line is the hash of an empty body whatever the body is: Backend.AI
stopped hashing bodies in API v4.20181215 (streamed uploads made it impractical)
and its clients still hash ``b""``; we do the same so that its SDKs can talk to us.

**Signed bodies (our extension).** A client that can hash its body sends
``X-BackendAI-Content-SHA256: <hex SHA-256 of the body>`` and signs an eighth line::

    x-backendai-content-sha256:<the same hex digest>

The hub then recomputes the body's hash and refuses the request when it differs,
so the signature covers the body: captured headers cannot carry another body.
Removing the header changes the string to sign (seven lines instead of eight),
so a signed body cannot be turned into an unsigned one. Without the header the
string to sign is exactly Backend.AI's. :func:`sign_request` sends the header
whenever it is given the body (``body=``), empty bodies included.

The signing key is derived per day and per host, so a signature cannot be reused
on another host, and a stolen derived key expires at the end of the day::

    key = HMAC-SHA256(HMAC-SHA256(secret, "YYYYMMDD" of the request date), host)

The request date must lie within ±15 minutes of the server's clock, and the hub
remembers every signature it accepted for that long and refuses a second use of
one (a replayed request): sign each request anew, with a date that has sub-second
precision (ISO 8601 with microseconds, as :func:`sign_request` does) when the same
request may be sent twice within a second.

This module has no hub imports: the CLI, benchmarks and the API's
authentication all use it.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .errors import Unauthorized

SIGN_METHOD = "HMAC-SHA256"
# The API version our clients announce (Backend.AI's vN.YYYYMMDD form). The server
# signs whatever version the client sent; it is only part of the signed string.
API_VERSION = "v8.20240915"
DEFAULT_CONTENT_TYPE = "application/json"
# What the server assumes when a request has no Content-Type (as aiohttp does).
MISSING_CONTENT_TYPE = "application/octet-stream"
MAX_SKEW = dt.timedelta(minutes=15)
EMPTY_BODY_SHA256 = hashlib.sha256(b"").hexdigest()
# The header that carries the body's hash when the client signs its body.
BODY_SHA256_HEADER = "X-BackendAI-Content-SHA256"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

_COMPACT_DATE = re.compile(r"^(\d{8})T(\d{2}):?(\d{2}):?(\d{2})(?:\.\d+)?Z$")


@dataclass(frozen=True)
class Credential:
    """What the ``Authorization`` header names: the method, the access key, the signature."""

    sign_method: str
    access_key: str
    signature: str


def parse_authorization(header: str | None) -> Credential:
    """Split a ``BackendAI signMethod=..., credential=AK:SIG`` header.

    Raises :class:`Unauthorized` with the reason when it is missing or malformed.
    """
    if not header:
        raise Unauthorized("Authorization header is missing")
    scheme, _, rest = header.strip().partition(" ")
    if scheme != "BackendAI" or not rest.strip():
        raise Unauthorized("malformed Authorization header: expected 'BackendAI signMethod=..., credential=...'")
    params: dict[str, str] = {}
    for part in rest.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or not key:
            raise Unauthorized(f"malformed Authorization header: bad parameter {part.strip()!r}")
        params[key.strip()] = value.strip()
    method = params.get("signMethod")
    credential = params.get("credential")
    if not method or not credential:
        raise Unauthorized("malformed Authorization header: signMethod and credential are required")
    if method.upper() != SIGN_METHOD:
        raise Unauthorized(f"unsupported signMethod {method!r}: only {SIGN_METHOD} is accepted")
    access_key, colon, signature = credential.partition(":")
    if not colon or not access_key or not signature:
        raise Unauthorized("malformed Authorization header: credential must be <access key>:<signature>")
    if not re.fullmatch(r"[0-9a-fA-F]{64}", signature):
        raise Unauthorized("malformed Authorization header: the signature must be 64 hex digits")
    return Credential(SIGN_METHOD, access_key, signature.lower())


def parse_date(raw: str) -> dt.datetime:
    """Parse a request date: RFC 1123 (``Date``), ISO 8601, or compact ``YYYYmmddTHHMMSSZ``.

    A date without a zone is taken as UTC, as Backend.AI does. The result keeps
    the zone it was given in: the signing key uses that calendar day.
    """
    raw = raw.strip()
    m = _COMPACT_DATE.match(raw)
    if m:
        day, hh, mm, ss = m.groups()
        return dt.datetime.strptime(day + hh + mm + ss, "%Y%m%d%H%M%S").replace(tzinfo=dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(raw)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError) as e:
            raise Unauthorized(f"unparseable request date {raw!r}") from e
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed


def check_date(date: dt.datetime, now: dt.datetime | None = None,
               max_skew: dt.timedelta = MAX_SKEW) -> None:
    """Refuse a date more than ``max_skew`` away from ``now`` (replays, wrong clocks)."""
    now = now or dt.datetime.now(dt.UTC)
    delta = date - now
    if abs(delta) > max_skew:
        direction = "in the future" if delta > dt.timedelta(0) else "old"
        raise Unauthorized(
            f"request date {date.isoformat()} is too {direction}: it must be within "
            f"{int(max_skew.total_seconds() // 60)} minutes of the server's clock "
            f"({now.replace(microsecond=0).isoformat()})"
        )


def media_type(content_type: str | None) -> str:
    """The media type as signed: lower case, parameters (charset, boundary) dropped."""
    if not content_type:
        return MISSING_CONTENT_TYPE
    return content_type.split(";", 1)[0].strip().lower() or MISSING_CONTENT_TYPE


def string_to_sign(method: str, path_query: str, raw_date: str, host: str,
                   content_type: str, version: str, body_sha256: str | None = None) -> str:
    lines = [
        method.upper(),
        path_query,
        raw_date,
        f"host:{host}",
        f"content-type:{content_type}",
        f"x-backendai-version:{version}",
        EMPTY_BODY_SHA256,
    ]
    if body_sha256 is not None:
        lines.append(f"x-backendai-content-sha256:{body_sha256}")
    return "\n".join(lines)


def signing_key(secret_key: str, date: dt.datetime, host: str) -> bytes:
    day = hmac.new(secret_key.encode(), date.strftime("%Y%m%d").encode(), hashlib.sha256).digest()
    return hmac.new(day, host.encode(), hashlib.sha256).digest()


def compute_signature(secret_key: str, *, method: str, path_query: str, raw_date: str,
                      date: dt.datetime, host: str, content_type: str, version: str,
                      body_sha256: str | None = None) -> str:
    msg = string_to_sign(method, path_query, raw_date, host, content_type, version, body_sha256)
    key = signing_key(secret_key, date, host)
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


# -- client side ------------------------------------------------------------------


def sign_request(method: str, url: str, access_key: str, secret_key: str, *,
                 date: dt.datetime | None = None, content_type: str = DEFAULT_CONTENT_TYPE,
                 version: str = API_VERSION, body=None) -> dict[str, str]:
    """The headers that make a request to ``url`` a signed one.

    ``url`` is the full URL the request goes to: its ``host[:port]`` and its
    path and query are signed as they will be sent. Send the returned headers
    as they are (``Host`` is what HTTP clients send by themselves for that URL).

    ``body``: the bytes (or ``str``, sent as UTF-8) that will be sent, ``b""`` for
    none, or a seekable binary file (read to the end for its hash, then put back
    where it was). When given, the body's hash is signed and sent in
    ``X-BackendAI-Content-SHA256``, and the hub refuses the request if the body it
    receives differs. ``None`` (the default): Backend.AI's unsigned-body form.
    """
    parts = urlsplit(url)
    if not parts.netloc:
        raise ValueError(f"not an absolute URL: {url!r}")
    path_query = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    date = date or dt.datetime.now(dt.UTC)
    raw_date = date.isoformat()
    ctype = media_type(content_type)
    digest = None if body is None else body_sha256(body)
    sig = compute_signature(
        secret_key, method=method, path_query=path_query, raw_date=raw_date, date=date,
        host=parts.netloc, content_type=ctype, version=version, body_sha256=digest,
    )
    headers = {
        "Authorization": f"BackendAI signMethod={SIGN_METHOD}, credential={access_key}:{sig}",
        "Date": raw_date,
        "Content-Type": content_type,
        "X-BackendAI-Version": version,
    }
    if digest is not None:
        headers[BODY_SHA256_HEADER] = digest
    return headers


def body_sha256(body) -> str:
    """Hex SHA-256 of a body: bytes, ``str`` (UTF-8) or a seekable binary file (its
    remaining bytes; the file is put back where it was)."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return hashlib.sha256(body).hexdigest()
    if hasattr(body, "read") and hasattr(body, "seek"):
        start = body.tell()
        h = hashlib.sha256()
        while chunk := body.read(1 << 20):
            h.update(chunk)
        body.seek(start)
        return h.hexdigest()
    raise TypeError(f"cannot hash a body of type {type(body).__name__}")


# -- server side ------------------------------------------------------------------


@dataclass(frozen=True)
class SignedRequest:
    """A request's signature material, checked for form and date but not yet for the key."""

    credential: Credential
    method: str
    path_query: str
    raw_date: str
    date: dt.datetime
    host: str
    content_type: str
    version: str
    # The X-BackendAI-Content-SHA256 header (lower-case hex), when the client signed its body.
    body_sha256: str | None = None

    @property
    def access_key(self) -> str:
        return self.credential.access_key

    def verify(self, secret_key: str) -> None:
        """Raise :class:`Unauthorized` unless the signature was made with ``secret_key``."""
        expected = compute_signature(
            secret_key, method=self.method, path_query=self.path_query, raw_date=self.raw_date,
            date=self.date, host=self.host, content_type=self.content_type, version=self.version,
            body_sha256=self.body_sha256,
        )
        if not hmac.compare_digest(expected, self.credential.signature):
            raise Unauthorized(
                "signature mismatch: check the secret key, and sign the method, path and query, "
                "Date, Host, Content-Type, X-BackendAI-Version"
                + (" and X-BackendAI-Content-SHA256" if self.body_sha256 else "")
                + " exactly as sent"
            )

    def check_body(self, body: bytes) -> None:
        """Raise :class:`Unauthorized` when the client signed a body hash and ``body``
        is not that body (headers captured and sent again with another body)."""
        if self.body_sha256 is None:
            return
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), self.body_sha256):
            raise Unauthorized(
                f"the request body does not match its signed hash ({BODY_SHA256_HEADER}): "
                "it was changed after signing"
            )


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        # Plain dicts are case-sensitive; HTTP headers are not.
        lowered = name.lower()
        for k, v in headers.items():
            if k.lower() == lowered:
                return v
    return value


def read_signed_request(method: str, path_query: str, headers: Mapping[str, str], *,
                        host: str | None = None, now: dt.datetime | None = None,
                        max_skew: dt.timedelta = MAX_SKEW) -> SignedRequest:
    """Parse and check what can be checked without the secret key: form and date.

    ``path_query`` is the request target as received (path and raw query);
    ``host`` defaults to the ``Host`` header. Raises :class:`Unauthorized` with
    the reason.
    """
    cred = parse_authorization(_header(headers, "Authorization"))
    raw_date = _header(headers, "Date") or _header(headers, "X-BackendAI-Date")
    if not raw_date:
        raise Unauthorized("a Date or X-BackendAI-Date header is required on signed requests")
    date = parse_date(raw_date)
    check_date(date, now, max_skew)
    version = _header(headers, "X-BackendAI-Version")
    if not version:
        raise Unauthorized("the X-BackendAI-Version header is required on signed requests")
    host = host if host is not None else _header(headers, "Host")
    if not host:
        raise Unauthorized("a Host header is required on signed requests")
    digest = _header(headers, BODY_SHA256_HEADER)
    if digest is not None:
        digest = digest.strip().lower()
        if not _HEX64.match(digest):
            raise Unauthorized(f"{BODY_SHA256_HEADER} must be the body's SHA-256 as 64 hex digits")
    return SignedRequest(
        credential=cred, method=method.upper(), path_query=path_query, raw_date=raw_date,
        date=date, host=host, content_type=media_type(_header(headers, "Content-Type")),
        version=version, body_sha256=digest,
    )


def verify_request(method: str, path_query: str, headers: Mapping[str, str], secret_key: str, *,
                   host: str | None = None, now: dt.datetime | None = None,
                   max_skew: dt.timedelta = MAX_SKEW, body: bytes | None = None) -> Credential:
    """Check a whole signed request against a known secret key; returns its credential.

    ``body``: the received body, checked against a signed body hash if there is one.
    """
    req = read_signed_request(method, path_query, headers, host=host, now=now, max_skew=max_skew)
    req.verify(secret_key)
    req.check_body(b"" if body is None else body)
    return req.credential
