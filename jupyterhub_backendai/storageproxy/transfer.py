"""Transfers as Backend.AI does them: straight to the storage proxy, with a token.

The manager (``POST /folders/<ref>/request-upload`` / ``request-download`` of the
Backend.AI client API, :mod:`...api.compat`) checks who may do what, then answers a
URL on the storage proxy and a short-lived token signed with a secret the manager
and the proxy share (:class:`TransferTokens`). The token names one file of one
folder, the operation and, for an upload, the size and an upload id. The proxy
checks only the token:

``/upload?token=...`` speaks **tus 1.0.0** (core protocol + the ``creation``
extension): ``OPTIONS`` (discovery), ``POST`` (creation, ``Upload-Length`` must be the
token's size; ``Location`` is the same URL), ``HEAD`` (``Upload-Offset``, to resume)
and ``PATCH`` (``application/offset+octet-stream`` at ``Upload-Offset``). Backend.AI's
own client skips creation and PATCHes the URL at once, which is also accepted. The
bytes go to ``<quota scope>/.tus/<upload id>`` on the folder's volume, so they count
against the quota scope while they are written; every write checks the scope's
limit (a write past it ends the upload: the partial file is removed, 413), and
the file appears in the folder only when its last byte arrived, by one
``rename``. Unfinished uploads are removed ``upload_idle`` seconds after their last
write.

A token *starts* a transfer only within its ``ttl`` (minutes); past it, it still
carries a transfer under way: the PATCHes and HEADs of a tus upload whose staged file
was written within ``upload_idle``, and the Range requests that resume a download of
the same token that answered within DOWNLOAD_RESUME seconds. Every request, either
way, is refused once the token's grant has ended.

``/download?token=...`` answers the file with ``Content-Length``,
``Last-Modified`` and ``Accept-Ranges``; ``Range: bytes=a-b`` (one range) gives
206, honoured with ``If-Range`` only while the file is unchanged.

The handlers serve the in-hub proxy (routes under the hub's API prefix, see
:mod:`...api.compat.handlers`) and the ``backendai-storage-proxy`` daemon alike.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import ssl
import stat
import struct
import threading
import time
import weakref

import aiohttp
from tornado import httputil, iostream, web
from tornado.log import access_log
from traitlets import Integer, Unicode, default
from traitlets.config import SingletonConfigurable

from ..common.errors import (
    BackendAIError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
    Unauthorized,
)
from .volumes import STAGING, VFSVolume, _os_error, check_ids

TUS_VERSION = "1.0.0"
#: Bytes held in memory before they are written (in a thread) during a PATCH.
WRITE_BUFFER = 4 << 20
READ_CHUNK = 4 << 20
#: A PATCH body or a download at least this big (on a plain-TCP connection) is moved
#: by a thread of its own on the bare socket, not through tornado's buffers: the
#: connection is taken over (``detach``) once the request is checked, the body is
#: received straight into one buffer and written to the staged file, a download is
#: sent with ``sendfile`` (no copy through Python); the answer ends the connection.
RAW_MIN = 256 << 10
RAW_BUF = 1 << 20  # (bigger falls out of the CPU caches: slower on this kind of VM)
#: Seconds a taken-over connection may stall before it is dropped.
RAW_TIMEOUT = 120.0
#: Transfers on taken-over connections at once; more wait for a turn.
RAW_THREADS = 128
#: How long a HEAD waits for a PATCH of the same upload to end (a client that
#: resumes right after its connection died must read the final offset).
SETTLE_WAIT = 15.0


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


class _Staged:
    """The on-disk state of one tus upload: ``<scope>/.tus/<id>`` (its size is the
    offset) and ``<id>.done`` once it was moved into the folder."""

    locks: dict[str, asyncio.Lock] = {}

    def __init__(self, vol: VFSVolume, claims: dict, idle: int):
        self.vol = vol
        self.claims = claims
        self.idle = idle
        self.id = claims["id"]
        if not (isinstance(self.id, str) and len(self.id) == 32):
            raise Unauthorized("the transfer token has no valid upload id")
        self.length = claims["size"]
        self.dir = os.path.join(vol.scope_path(claims["scope"]), STAGING)
        self.path = os.path.join(self.dir, self.id)
        self.done_path = self.path + ".done"

    def lock(self) -> asyncio.Lock:
        return self.locks.setdefault(self.id, asyncio.Lock())

    async def settled(self) -> bool:
        """Wait until no PATCH of this upload is under way (its last write included),
        so the offset read next is the one a resuming client must send. False if one
        is still going after ``SETTLE_WAIT`` seconds."""
        lock = self.locks.get(self.id)
        if lock is None or not lock.locked():
            return True
        try:
            async with asyncio.timeout(SETTLE_WAIT):
                await lock.acquire()
        except TimeoutError:
            return False
        lock.release()
        return True

    def offset(self) -> int | None:
        """Bytes received so far; the length once finished; None if not begun."""
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            pass
        if os.path.exists(self.done_path):
            return self.length
        return None

    def live(self) -> bool:
        """An unfinished upload that was created or written within ``idle`` seconds:
        one under way, which a token past its TTL may go on with."""
        try:
            return os.stat(self.path).st_mtime >= time.time() - self.idle
        except FileNotFoundError:
            return False

    def create(self) -> int:
        """Begin the upload (idempotent); checks that the target can be written."""
        off = self.offset()
        if off is not None:
            return off
        self._check_target()
        scope_dir = os.path.dirname(self.dir)
        if not os.path.isdir(scope_dir):
            raise NotFound("the folder's quota scope does not exist on this volume")
        self.vol.make_staging(self.claims["scope"])
        self._expire()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            if os.geteuid() == 0:
                os.fchown(fd, self.vol.folder_uid, self.vol.folder_gid)
        finally:
            os.close(fd)
        return 0

    #: When each staging directory was last swept (at most one sweep a minute).
    swept: dict[str, float] = {}

    def _expire(self) -> None:
        """Remove unfinished uploads and markers nobody touched for ``idle`` seconds."""
        now = time.time()
        if now - self.swept.get(self.dir, 0) < 60:
            return
        self.swept[self.dir] = now
        cutoff = now - self.idle
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return
        for name in names:
            p = os.path.join(self.dir, name)
            try:
                if os.lstat(p).st_mtime < cutoff:
                    os.unlink(p)
            except OSError:
                pass

    def _check_target(self) -> None:
        fd, name, shown = self.vol._parent(self.claims["scope"], self.claims["folder"],
                                           self.claims["path"])
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            return
        finally:
            os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Conflict(f"{shown!r}: is a directory")

    def room(self) -> int | None:
        """Bytes the quota scope may still take (the staged bytes already count), or
        None without a limit."""
        limit = self.vol._read_limit(self.claims["scope"])
        if limit is None:
            return None
        used = self.vol.scope_usage(self.claims["scope"])["used_bytes"]
        fd, name, _ = self.vol._parent(self.claims["scope"], self.claims["folder"],
                                       self.claims["path"])
        try:
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISREG(st.st_mode):
                used -= st.st_size  # the file it replaces is freed
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
        return limit - used

    def discard(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def commit(self, parent: tuple[int, str, str] | None = None) -> None:
        """Move the finished file into the folder (one rename: visible at once, whole);
        on any failure (the folder or directory gone meanwhile) the bytes are dropped.
        ``parent``: the target's (directory fd, name, shown path) if already open (it
        is closed here)."""
        try:
            fd, name, shown = parent or self.vol._parent(
                self.claims["scope"], self.claims["folder"], self.claims["path"])
        except BaseException:
            self.discard()
            raise
        try:
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    raise Conflict(f"{shown!r}: is a directory")
            except FileNotFoundError:
                pass
            self.vol.place_staged(self.path, fd, name)
        except OSError as e:
            self.discard()
            raise _os_error(e, shown) from None
        except BaseException:
            self.discard()
            raise
        finally:
            os.close(fd)
        os.close(os.open(self.done_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644))


#: Seconds a "still granted" answer is kept for a token: the longest a token outlives
#: the access it was issued for.
GRANT_FRESH = 2.0
_GRANTED: dict[str, float] = {}  # token -> until when its grant is known to hold
#: Seconds after a download's request ended in which its token, past its TTL, may
#: still resume it (``Range``): a client's retry after a broken connection.
DOWNLOAD_RESUME = 60.0
#: token -> [requests of it answering now, when the last one ended (monotonic)]: the
#: downloads under way (this process).
_DOWNLOADS: dict[str, list] = {}


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
            if not isinstance(claims.get("user"), str):
                raise Unauthorized("the transfer token names no user; request a new one")
            now = time.monotonic()
            if _GRANTED.get(token, 0.0) < now:
                _GRANTED.pop(token, None)
                await self._grants(self, claims)
                if len(_GRANTED) > 10_000:
                    _GRANTED.clear()
                _GRANTED[token] = now + GRANT_FRESH
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
        self.finish(_problem_json(e))

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


def _problem_json(e: BackendAIError) -> str:
    return json.dumps({
        "type": "https://api.backend.ai/probs/" + {
            400: "invalid-api-params", 401: "auth-failed", 403: "forbidden",
            404: "object-not-found", 409: "conflict", 413: "quota-exceeded",
            416: "invalid-api-params"}.get(e.status_code, "storage-proxy-error"),
        "title": e.title if e.detail == e.title else f"{e.title}: {e.detail}",
        "status": e.status_code, "detail": e.detail, "error": type(e).__name__,
    })


# -- Taken-over connections (RAW_MIN) -------------------------------------------------

#: RAW_THREADS slots per event loop (a semaphore belongs to one loop).
_raw_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _raw_capable(handler: web.RequestHandler) -> bool:
    """A plain-TCP HTTP/1.1 connection (TLS and anything else keep tornado's path)."""
    stream = getattr(handler.request.connection, "stream", None)
    return (type(stream) is iostream.IOStream and isinstance(stream.socket, socket.socket)
            and handler.request.version == "HTTP/1.1")


async def _take_over(handler: web.RequestHandler, body: int = 0,
                     expect: bool = False) -> tuple[socket.socket, bytes]:
    """Detach the connection from tornado: (a socket of our own, in blocking mode with
    RAW_TIMEOUT, and the first bytes of the body tornado had already read). Raises
    :class:`iostream.StreamClosedError` if the client left."""
    stream = handler.detach()
    try:
        if expect:
            await stream.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        first = await stream.read_bytes(body, partial=True) if body else b""
        fd = os.dup(stream.socket.fileno())
    finally:
        stream.close()
    sock = socket.socket(fileno=fd)
    # Blocking, so each call moves as much as it can (a socket with a Python timeout is
    # non-blocking underneath: many small reads and sends); stalls end by the kernel's
    # own timeouts (the call fails with EAGAIN, an OSError).
    sock.settimeout(None)
    tv = struct.pack("ll", int(RAW_TIMEOUT), 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    return sock, first


async def _in_thread(fn, *args):
    """``fn(*args)`` in a daemon thread of its own (a long transfer holds it: never a
    worker of the shared executor, and never a reason for the process to wait at exit)."""
    loop = asyncio.get_running_loop()
    slots = _raw_slots.get(loop)
    if slots is None:
        slots = _raw_slots[loop] = asyncio.Semaphore(RAW_THREADS)
    fut = loop.create_future()

    def done(ok, value):
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def run():
        try:
            value = fn(*args)
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(done, False, e)
        else:
            loop.call_soon_threadsafe(done, True, value)

    async with slots:
        threading.Thread(target=run, name="transfer", daemon=True).start()
        return await fut


def _head(status: int, headers: dict) -> bytes:
    """A response's status line and headers; the connection ends after it."""
    lines = [f"HTTP/1.1 {status} {httputil.responses.get(status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _answer(sock: socket.socket, status: int, headers: dict, body: bytes = b"") -> None:
    try:
        if status != 204:
            headers = dict(headers, **{"Content-Length": str(len(body))})
        sock.sendall(_head(status, headers) + body)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client left: nothing to tell it


def _problem_answer(sock: socket.socket, e: BackendAIError) -> None:
    _answer(sock, e.status_code, {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store",
                                  "Content-Type": "application/problem+json"},
            _problem_json(e).encode())


def _receive(sock: socket.socket, fd: int, first: bytes, count: int,
             room: int | None, at: int) -> tuple[int, object]:
    """Receive a body of ``count`` bytes (``first`` already read) into ``fd`` from
    offset ``at`` on as it arrives: ``splice`` (socket, pipe, file: no copy through
    Python) where the kernel can, else reads into one buffer and ``pwrite``. Every
    piece is checked against ``room`` before it is written. (bytes written, why it
    stopped short: None, "gone" (the client left or stalled), "quota" (past ``room``)
    or the OSError of a write). After a refusal the rest of the body is read and
    dropped, so the client reads the answer."""
    written, received = 0, len(first)
    why: object = None
    if first:
        if room is not None and len(first) > room:
            why = "quota"
        else:
            try:
                _pwrite_all(fd, memoryview(first), at)
                written = len(first)
            except OSError as e:
                why = e
    pipe = _pipe() if why is None else None
    buf = view = None
    try:
        while why is None and received < count:
            want = min(RAW_BUF, count - received)
            if pipe is not None:
                try:
                    n = os.splice(sock.fileno(), pipe[1], want)
                except OSError as e:
                    if e.errno == errno.EINVAL and received == len(first):
                        _close_pipe(pipe)  # this socket cannot splice: read instead
                        pipe = None
                        continue
                    return written, "gone"
            else:
                if buf is None:
                    buf = bytearray(min(RAW_BUF, count))
                    view = memoryview(buf)
                try:
                    n = sock.recv_into(view, want, socket.MSG_WAITALL)
                except OSError:  # reset, or RAW_TIMEOUT without a byte
                    return written, "gone"
            if not n:
                return written, "gone"
            received += n
            if room is not None and written + n > room:
                why = "quota"
                break
            try:
                if pipe is not None:
                    pipe = _splice_out(pipe, fd, n, at + written)
                else:
                    _pwrite_all(fd, view[:n], at + written)
            except OSError as e:
                why = e
                break
            written += n
    finally:
        if pipe is not None:
            _close_pipe(pipe)
    if why is None:
        return written, None
    drain = bytearray(min(RAW_BUF, max(count - received, 1)))
    while received < count:  # drain what the client still sends, then answer
        try:
            n = sock.recv_into(drain, min(len(drain), count - received))
        except OSError:
            return written, "gone"
        if not n:
            return written, "gone"
        received += n
    return written, why


def _raw_patch(sock: socket.socket, fd: int, first: bytes, count: int, room: int | None,
               at: int, st: _Staged, release) -> None:
    """A taken-over PATCH in its transfer thread: the body into the staged file
    (:func:`_receive`), then the upload's end (the last byte: commit; past the quota:
    discard), ``release`` (the upload's lock, on the event loop: queued before the
    answer goes out, so the client's next PATCH finds it free), the answer."""
    # Written at explicit offsets (splice refuses an O_APPEND file); the lock makes
    # this PATCH the upload's only writer, and ``at`` is its size.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)
    written, why = _receive(sock, fd, first, count, room, at)
    if why == "gone":
        return  # what was written is kept: tus resumes from the offset
    error, offset = None, at + written
    try:
        if why == "quota":
            st.discard()
            error = _quota(st, room)
        elif isinstance(why, OSError):
            error = _os_error(why, st.claims["path"])
        elif offset == st.length:
            st.commit()
    except BackendAIError as e:
        error = e
    release()
    if error is not None:
        _problem_answer(sock, error)
    else:
        _answer(sock, 204, {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store",
                            "Upload-Offset": str(offset)})


def _pipe() -> tuple[int, int] | None:
    if not hasattr(os, "splice"):
        return None
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, 1031, RAW_BUF)  # F_SETPIPE_SZ (at most /proc/sys/fs/pipe-max-size)
    except OSError:
        pass
    return r, w


def _close_pipe(pipe: tuple[int, int]) -> None:
    os.close(pipe[0])
    os.close(pipe[1])


def _splice_out(pipe: tuple[int, int], fd: int, n: int, at: int) -> tuple[int, int] | None:
    """Move the ``n`` bytes in ``pipe`` to ``fd`` at ``at``. A file system that cannot
    take a splice gets them by ``pwrite`` (and no pipe from then on: None)."""
    done = 0
    while done < n:
        try:
            done += os.splice(pipe[0], fd, n - done, offset_dst=at + done)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            while done < n:
                chunk = os.read(pipe[0], n - done)
                _pwrite_all(fd, memoryview(chunk), at + done)
                done += len(chunk)
            _close_pipe(pipe)
            return None
    return pipe


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def _send_file(sock: socket.socket, head: bytes, fd: int, start: int, length: int) -> None:
    """The head, then ``length`` bytes of ``fd`` from ``start`` by ``sendfile`` (a file
    that shrank meanwhile gives a short body: the client sees the connection end)."""
    try:
        sock.sendall(head)
        out = sock.fileno()
        pos, end = start, start + length
        while pos < end:
            n = os.sendfile(out, fd, pos, min(end - pos, 1 << 30))
            if not n:
                return  # the file shrank
            pos += n
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client left, or stalled past RAW_TIMEOUT


def _header_int(handler: web.RequestHandler, name: str) -> int:
    raw = handler.request.headers.get(name)
    if raw is None or not raw.isdigit():
        raise InvalidRequest(f"the {name} header must be a non-negative integer, not {raw!r}")
    return int(raw)


@web.stream_request_body
class TusUploadHandler(TransferHandler):
    """``/upload?token=``: tus 1.0.0 (core + creation) for one file."""

    staged: _Staged | None = None
    error: BackendAIError | None = None
    _fd: int | None = None
    _pending: asyncio.Future | None = None
    _pending_n = 0
    _gone = False
    #: A body under RAW_MIN: its Content-Length, received whole, then checked and
    #: written in one thread hop (patch); None for a streamed body.
    _small: int | None = None
    _busy = False

    def set_default_headers(self):
        self.set_header("Tus-Resumable", TUS_VERSION)
        self.set_header("Cache-Control", "no-store")

    async def _staged(self) -> _Staged:
        claims = await self.claims("upload")
        if not isinstance(claims.get("size"), int) or claims["size"] < 0:
            raise Unauthorized("the transfer token has no valid size")
        return _Staged(self.volume(claims), claims, self.tokens.upload_idle)

    async def under_way(self, token: str, claims: dict) -> bool:
        """An upload under way (created with the token within its TTL, written within
        ``upload_idle``) takes PATCHes and HEADs past the TTL; creating one does not."""
        if self.request.method not in ("PATCH", "HEAD"):
            return False
        try:
            st = _Staged(self.volume(claims), claims, self.tokens.upload_idle)
        except BackendAIError:
            return False
        return await asyncio.to_thread(st.live)

    def options(self):
        self.set_header("Tus-Version", TUS_VERSION)
        self.set_header("Tus-Extension", "creation")
        self.set_status(204)
        self.finish()

    async def post(self):
        try:
            st = await self._staged()
            length = _header_int(self, "Upload-Length")
            if length != st.length:
                raise InvalidRequest(f"Upload-Length is {length}, but the token was issued "
                                     f"for {st.length} bytes")
            room = await asyncio.to_thread(st.room)
            if room is not None and length > room:
                raise _quota(st, room)
            await asyncio.to_thread(st.create)
        except BackendAIError as e:
            return self.problem(e)
        self.set_header("Location", self.request.full_url())
        self.set_header("Upload-Offset", "0")
        self.set_status(201)
        self.finish()

    async def head(self):
        try:
            st = await self._staged()
            if not await st.settled():
                raise BackendAIError("a PATCH of this upload is in progress", status_code=423)
            off = await asyncio.to_thread(st.create)
        except BackendAIError as e:
            self.clear()
            self.set_status(e.status_code)
            self.set_header("Tus-Resumable", TUS_VERSION)
            return self.finish()
        self.set_header("Upload-Offset", str(off))
        self.set_header("Upload-Length", str(st.length))
        self.set_status(200)
        self.finish()

    async def prepare(self):
        if self.request.method != "PATCH":
            return
        self._buf: list[bytes] = []
        self._buffered = 0
        self._written = 0
        try:
            st = self.staged = await self._staged()
            ctype = self.request.headers.get("Content-Type", "")
            if ctype.split(";")[0].strip() != "application/offset+octet-stream":
                raise BackendAIError(
                    "Content-Type must be application/offset+octet-stream", status_code=415)
            offset = _header_int(self, "Upload-Offset")
            await self.lock_acquire(st)
            count = self.request.headers.get("Content-Length", "")
            if (count.isdigit() and int(count) < RAW_MIN
                    and "Transfer-Encoding" not in self.request.headers):
                self._small, self._offset = int(count), offset
                self.request.connection.set_max_body_size(min(st.length, RAW_MIN))
                return

            def begin():  # one trip to a thread: each costs a wake-up on a busy machine
                current = st.create()
                if offset != current or current >= st.length:
                    return current, None
                return current, st.room()

            current, self._room = await asyncio.to_thread(begin)
            if offset != current:
                raise Conflict(f"Upload-Offset is {offset}, but the upload is at {current}")
            if current >= st.length:
                raise Conflict("the upload is already complete")
            self._offset = current
            self.request.connection.set_max_body_size(st.length - current)
            self._fd = os.open(st.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except BackendAIError as e:
            self.error = e
            return
        except OSError as e:
            self.error = _os_error(e, "the upload")
            return
        headers = self.request.headers
        count = headers.get("Content-Length", "")
        if (count.isdigit() and RAW_MIN <= int(count) <= st.length - current
                and "Transfer-Encoding" not in headers and _raw_capable(self)):
            await self._patch_raw(int(count))

    async def _patch_raw(self, count: int):
        """The PATCH on a taken-over connection (RAW_MIN): the same checks, the same
        answers, the body written by a thread of its own straight from the socket; that
        thread also ends the upload (commit or discard) and answers, so a PATCH costs
        the event loop no more trips to threads than the one."""
        sock = None
        try:
            try:
                sock, first = await _take_over(
                    self, count, self.request.headers.get("Expect", "").lower() == "100-continue")
            except iostream.StreamClosedError:
                return  # the client left before the body: nothing was written
            loop = asyncio.get_running_loop()
            await _in_thread(_raw_patch, sock, self._fd, first, count, self._room,
                             self._offset, self.staged,
                             lambda: loop.call_soon_threadsafe(self._release))
        finally:
            self._close()
            self._release()
            if sock is not None:
                sock.close()

    async def lock_acquire(self, st: _Staged):
        lock = st.lock()
        if lock.locked():
            raise BackendAIError("another PATCH of this upload is in progress", status_code=423)
        await lock.acquire()
        self._lock = lock

    async def data_received(self, chunk: bytes):
        if self._small is not None and self.error is None:
            self._buf.append(chunk)
            return
        if self.error is not None or self._fd is None:
            return
        self._buf.append(chunk)
        self._buffered += len(chunk)
        if self._buffered >= WRITE_BUFFER:
            await self._flush()

    async def _flush(self, last: bool = False):
        """Write what is buffered in a thread while the next bytes arrive: at most one
        write is under way (``_pending``); ``last`` waits for it."""
        data = b"".join(self._buf)
        self._buf, self._buffered = [], 0
        await self._wait_pending()
        if data and self.error is None:
            st = self.staged
            if self._offset + self._written + len(data) > st.length:
                self.error = InvalidRequest(f"more bytes than the {st.length} of Upload-Length")
            elif self._room is not None and self._written + len(data) > self._room:
                # Past the quota: the upload ends here and leaves nothing behind.
                self.error = _quota(st, self._room)
                self._close()
                await asyncio.to_thread(st.discard)
            else:
                self._pending_n = len(data)
                self._pending = asyncio.ensure_future(
                    asyncio.to_thread(_write_all, self._fd, data))
                self._pending.add_done_callback(self._write_done)
        if last:
            await self._wait_pending()

    def _write_done(self, _fut):
        if self._gone:  # the client left during the write: end here
            self._close()
            self._release()

    async def _wait_pending(self):
        fut, self._pending = self._pending, None
        if fut is None:
            return
        try:
            await fut
        except OSError as e:
            self.error = _os_error(e, self.staged.claims["path"])
            return
        self._written += self._pending_n

    def _close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def patch(self):
        if self._small is not None:
            return await self._patch_small()
        try:
            await self._flush(last=True)
            self._close()
            if self.error is not None:
                raise self.error
            st = self.staged
            offset = self._offset + self._written
            if offset == st.length:
                await asyncio.to_thread(st.commit)
            self.set_header("Upload-Offset", str(offset))
            self.set_status(204)
            self.finish()
        except BackendAIError as e:
            self.problem(e)
        finally:
            self._release()

    async def _patch_small(self):
        try:
            if self.error is not None:
                raise self.error
            self._busy = True
            try:
                offset = await _small_io(self, _small_patch, self.staged, self._offset,
                                         b"".join(self._buf))
            finally:
                self._busy = False
            self.set_header("Upload-Offset", str(offset))
            self.set_status(204)
            self.finish()
        except BackendAIError as e:
            self.problem(e)
        finally:
            self._release()

    def _release(self):
        lock = getattr(self, "_lock", None)
        if lock is not None:
            self._lock = None
            lock.release()
            if self.staged is not None:
                _Staged.locks.pop(self.staged.id, None)  # PATCHes never wait (423)

    def on_connection_close(self):
        # The client left mid-PATCH: what was written is kept (tus resumes from the
        # offset); a write under way finishes first (see _flush).
        self._buf, self._buffered = [], 0
        self._gone = True
        if self.error is None:
            self.error = BackendAIError("the client left", status_code=400)
        if (self._pending is None or self._pending.done()) and not self._busy:
            self._close()
            self._release()


async def _small_io(handler: web.RequestHandler, fn, *args):
    """``fn(*args)``, a few metadata calls and at most RAW_MIN bytes of page cache, run
    on the loop's own thread: a hop to a worker thread and back costs more than the
    calls. ``transfer_inline_io=False`` in the application's settings (the daemon's
    ``c.StorageProxyApp.transfer_inline_io``) sends them to a thread, for volumes on a
    file system that can stall (a remote one)."""
    if handler.settings.get("transfer_inline_io", True):
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def _small_patch(st: _Staged, offset: int, data: bytes) -> int:
    """A whole small PATCH body (in memory) in one go: the same checks as a streamed
    one (offset, length, quota, the target), appended, and moved into the folder if it
    was the last byte. A new upload's staged file is created and written through one
    descriptor, and the target's directory is opened once for the check and the
    rename. The new offset."""
    current = st.offset()
    fresh = current is None
    if fresh:
        current = 0
    if offset != current:
        raise Conflict(f"Upload-Offset is {offset}, but the upload is at {current}")
    if current >= st.length:
        raise Conflict("the upload is already complete")
    if len(data) > st.length - current:
        raise InvalidRequest(f"more bytes than the {st.length} of Upload-Length")
    room = st.room()
    if room is not None and len(data) > room:
        st.discard()  # past the quota: the upload ends here and leaves nothing behind
        raise _quota(st, room)
    final = current + len(data) == st.length
    parent = None
    if fresh or final:
        try:
            parent = st.vol._parent(st.claims["scope"], st.claims["folder"], st.claims["path"])
        except BaseException:
            if not fresh:
                st.discard()  # the target's directory is gone: the upload cannot end
            raise
    try:
        if parent is not None:
            try:
                if stat.S_ISDIR(os.lstat(parent[1], dir_fd=parent[0]).st_mode):
                    if not fresh:
                        st.discard()
                    raise Conflict(f"{parent[2]!r}: is a directory")
            except FileNotFoundError:
                pass
        try:
            if fresh:
                os.makedirs(st.dir, mode=0o700, exist_ok=True)
                st._expire()
                fd = os.open(st.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644)
            else:
                fd = os.open(st.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise _os_error(e, "the upload") from None
        try:
            if fresh and os.geteuid() == 0:
                os.fchown(fd, st.vol.folder_uid, st.vol.folder_gid)
            _write_all(fd, data)
        except OSError as e:
            raise _os_error(e, st.claims["path"]) from None
        finally:
            os.close(fd)
        current += len(data)
        if final:
            st.commit(parent)  # closes the directory
            parent = None
    finally:
        if parent is not None:
            os.close(parent[0])
    return current


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _quota(st: _Staged, room: int) -> StorageQuotaExceeded:
    return StorageQuotaExceeded(
        f"quota scope {st.claims['scope']} on volume {st.vol.name} has {max(room, 0)} bytes "
        f"left; {st.claims['path']!r} needs {st.length}")


class DownloadHandler(TransferHandler):
    """``/download?token=``: one file, with ``Range`` (one range) and ``If-Range``."""

    async def get(self):
        await self._send(body=True)

    async def head(self):
        await self._send(body=False)

    async def under_way(self, token: str, claims: dict) -> bool:
        """A Range GET that resumes a download of this token that is answering or
        ended within DOWNLOAD_RESUME seconds (a client's retry after a broken
        connection) goes on past the TTL; a new download does not."""
        if self.request.method != "GET" or "Range" not in self.request.headers:
            return False
        seen = _DOWNLOADS.get(token)
        return seen is not None and (
            seen[0] > 0 or time.monotonic() - seen[1] < DOWNLOAD_RESUME)

    async def _send(self, body: bool):
        try:
            claims = await self.claims("download")
            vol = self.volume(claims)
            size, chunks, st, small = await _small_io(self, _open_download, vol, claims, body)
        except BackendAIError as e:
            return self.problem(e)
        fd = chunks._fd
        token = self.token()
        if body:  # a download under way (see under_way)
            if len(_DOWNLOADS) > 10_000:
                _DOWNLOADS.clear()
            _DOWNLOADS.setdefault(token, [0, 0.0])[0] += 1
        try:
            last_modified = email.utils.formatdate(st.st_mtime, usegmt=True)
            etag = f'"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"'
            start, end = 0, size - 1
            status = 200
            rng = self.request.headers.get("Range")
            if_range = self.request.headers.get("If-Range")
            if rng and (if_range is None or if_range in (last_modified, etag)):
                parsed = _parse_range(rng, size)
                if parsed is None:
                    return self.problem(
                        BackendAIError(f"the range {rng!r} is not within the file's {size} "
                                       "bytes", status_code=416),
                        {"Content-Range": f"bytes */{size}"})
                start, end = parsed
                status = 206
            name = os.path.basename(claims["path"])
            length = max(end - start + 1, 0)
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Disposition": f"attachment; filename*=UTF-8''{_quote(name)}",
                "Accept-Ranges": "bytes",
                "Last-Modified": last_modified,
                "ETag": etag,
                "Content-Length": str(length),
            }
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
            if body and length >= RAW_MIN and _raw_capable(self):
                sock, _ = await _take_over(self)
                try:
                    await _in_thread(_send_file, sock, _head(status, headers), fd, start, length)
                finally:
                    sock.close()
                return
            self.set_status(status)
            for k, v in headers.items():
                self.set_header(k, v)
            if not body:
                return self.finish()
            if small is not None:  # read whole in the same thread hop as the open
                if length:
                    self.write(small[start:end + 1])
                return self.finish()
            pos = start
            while pos <= end:
                n = min(READ_CHUNK, end - pos + 1)
                data = await asyncio.to_thread(os.pread, fd, n, pos)
                if not data:
                    break  # the file shrank: the client sees a short body
                self.write(data)
                pos += len(data)
                await self.flush()
            self.finish()
        except iostream.StreamClosedError:
            return  # the client left
        except OSError as e:
            if e.errno in (errno.EPIPE, errno.ECONNRESET):
                return
            raise
        finally:
            chunks.close()
            if body:
                seen = _DOWNLOADS.setdefault(token, [1, 0.0])
                seen[0], seen[1] = max(seen[0] - 1, 0), time.monotonic()
                _forget_downloads()


def _forget_downloads() -> None:
    """Drop the downloads that can no longer be resumed past their TTL."""
    now = time.monotonic()
    if len(_DOWNLOADS) < 256:
        return
    for token, (active, ended) in list(_DOWNLOADS.items()):
        if not active and now - ended >= DOWNLOAD_RESUME:
            _DOWNLOADS.pop(token, None)


def _open_download(vol: VFSVolume, claims: dict, body: bool):
    """(size, chunks, stat, the whole content if under RAW_MIN and wanted, else None)."""
    size, chunks = vol.download(claims["scope"], claims["folder"], claims["path"])
    try:
        st = os.fstat(chunks._fd)
        small = os.pread(chunks._fd, size, 0) if body and size < RAW_MIN else None
    except BaseException:
        chunks.close()
        raise
    return size, chunks, st, small


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) byte of ``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n``; None when
    unsatisfiable or malformed; several ranges are refused as unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            if n <= 0:
                return None
            return max(size - n, 0), size - 1
        a = int(first)
        b = int(last) if last else size - 1
    except ValueError:
        return None
    if a < 0 or a >= size or b < a:
        return None
    return a, min(b, size - 1)


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


class HubGrants:
    """A daemon's grant check (``grants`` of :class:`TransferHandler`): asks the hub that
    issued the token (``POST <url>?token=``; 204: it holds). Closed when the hub does not
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

    async def __call__(self, handler: TransferHandler, claims: dict) -> None:
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


def routes(prefix: str, volume, grants=None) -> list[tuple]:
    """The two routes under ``prefix``; ``volume``: (handler, name) -> :class:`VFSVolume`;
    ``grants``: see :class:`TransferHandler`."""
    kw = {"volume": volume, "grants": grants}
    return [
        (prefix + "/upload", TusUploadHandler, kw),
        (prefix + "/download", DownloadHandler, kw),
    ]
