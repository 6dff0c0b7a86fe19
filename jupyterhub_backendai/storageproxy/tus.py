"""tus 1.0.0 uploads (core protocol + ``creation``) straight into a folder's quota scope.

See :mod:`.transfer` for the protocol as a client sees it. The bytes are staged in
``<quota scope>/.tus/<upload id>`` (:class:`_Staged`), checked against the scope's
limit on every write, and moved into the folder by one ``rename`` when the last byte
arrived. A small PATCH body is received whole and written in one go; a big one on a
taken-over connection (:mod:`.rawio`).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import stat
import time

from tornado import iostream, web

from ..common.errors import (
    BackendAIError,
    Conflict,
    InvalidRequest,
    NotFound,
    StorageQuotaExceeded,
    Unauthorized,
)
from .paths import _os_error
from .rawio import RAW_MIN, answer, in_thread, raw_capable, receive, take_over
from .transferhandler import TUS_VERSION, TransferHandler, problem_json, small_io
from .volumes import STAGING, VFSVolume

#: Bytes held in memory before they are written (in a thread) during a PATCH.
WRITE_BUFFER = 4 << 20
#: How long a HEAD waits for a PATCH of the same upload to end (a client that
#: resumes right after its connection died must read the final offset).
SETTLE_WAIT = 15.0


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
        self.bounded = f"quota scope {claims['scope']}"  # what room() found tightest

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
        """Bytes the upload may still take: what its quota scope has left (the staged
        bytes already count there) or, where the folder's own limit leaves less, the
        folder's (less what is staged); None where neither has a limit."""
        replaced = 0
        try:
            fd, name, _ = self.vol._parent(self.claims["scope"], self.claims["folder"],
                                           self.claims["path"])
        except BaseException:  # the folder or directory is gone: the upload never ends
            self.discard()
            raise
        try:
            st = os.lstat(name, dir_fd=fd)
            if stat.S_ISREG(st.st_mode):
                replaced = st.st_size  # the file it replaces is freed
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
        try:
            staged = os.stat(self.path).st_size
        except FileNotFoundError:
            staged = 0
        bound = self.vol.upload_bound(self.claims["scope"], self.claims["folder"], replaced,
                                      staged)
        if bound is None:
            return None
        self.bounded, limit, used = bound
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
            self.vol.place_staged(self.path, fd, name, owned=self.vol._read_folder_limit(
                self.claims["scope"], self.claims["folder"]) is not None)
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


def _problem_answer(sock: socket.socket, e: BackendAIError) -> None:
    answer(sock, e.status_code, {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store",
                                  "Content-Type": "application/problem+json"},
            problem_json(e).encode())


# A write the file system refused for good (a btrfs qgroup's limit, a full disk).
_FULL = (errno.EDQUOT, errno.ENOSPC)


def _raw_patch(sock: socket.socket, fd: int, first: bytes, count: int, room: int | None,
               at: int, st: _Staged, release) -> None:
    """A taken-over PATCH in its transfer thread: the body into the staged file
    (:func:`receive`), then the upload's end (the last byte: commit; past the quota:
    discard), ``release`` (the upload's lock, on the event loop: queued before the
    answer goes out, so the client's next PATCH finds it free), the answer."""
    # Written at explicit offsets (splice refuses an O_APPEND file); the lock makes
    # this PATCH the upload's only writer, and ``at`` is its size.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)
    written, why = receive(sock, fd, first, count, room, at)
    if why == "gone":
        return  # what was written is kept: tus resumes from the offset
    error, offset = None, at + written
    try:
        if why == "quota":
            st.discard()
            error = _quota(st, room)
        elif isinstance(why, OSError):
            if why.errno in _FULL:  # the file system's own limit: nothing stays behind
                st.discard()
            error = _os_error(why, st.claims["path"])
        elif offset == st.length:
            st.commit()
    except BackendAIError as e:
        error = e
    release()
    if error is not None:
        _problem_answer(sock, error)
    else:
        answer(sock, 204, {"Tus-Resumable": TUS_VERSION, "Cache-Control": "no-store",
                            "Upload-Offset": str(offset)})


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

    def _end(self, status: int, headers: dict) -> None:
        """End the request with ``status`` and ``headers`` (no body)."""
        for k, v in headers.items():
            self.set_header(k, v)
        self.set_status(status)
        self.finish()

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
        self._end(204, {"Tus-Version": TUS_VERSION, "Tus-Extension": "creation"})

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
        self._end(201, {"Location": self.request.full_url(), "Upload-Offset": "0"})

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
        self._end(200, {"Upload-Offset": str(off), "Upload-Length": str(st.length)})

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
                and "Transfer-Encoding" not in headers and raw_capable(self)):
            await self._patch_raw(int(count))

    async def _patch_raw(self, count: int):
        """The PATCH on a taken-over connection (RAW_MIN): the same checks, the same
        answers, the body written by a thread of its own straight from the socket; that
        thread also ends the upload (commit or discard) and answers, so a PATCH costs
        the event loop no more trips to threads than the one."""
        sock = None
        try:
            try:
                sock, first = await take_over(
                    self, count, self.request.headers.get("Expect", "").lower() == "100-continue")
            except iostream.StreamClosedError:
                return  # the client left before the body: nothing was written
            loop = asyncio.get_running_loop()
            await in_thread(_raw_patch, sock, self._fd, first, count, self._room,
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
            if e.errno in _FULL:  # the file system's own limit: nothing stays behind
                self._close()
                await asyncio.to_thread(self.staged.discard)
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
            self._end(204, {"Upload-Offset": str(offset)})
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
                offset = await small_io(self, _small_patch, self.staged, self._offset,
                                         b"".join(self._buf))
            finally:
                self._busy = False
            self._end(204, {"Upload-Offset": str(offset)})
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
        f"{st.bounded} on volume {st.vol.name} has {max(room, 0)} bytes "
        f"left; {st.claims['path']!r} needs {st.length}")

