"""Downloads: one file per token, with ``Range`` (one range) and ``If-Range``.

Small files are read whole in the request's own thread hop; big ones (RAW_MIN and
more) are sent with ``sendfile`` on a taken-over connection (:mod:`.rawio`). A token
past its TTL may still resume (``Range``) a download of its own that answered within
DOWNLOAD_RESUME seconds.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import os
import time

from tornado import iostream

from ..common.errors import BackendAIError
from .rawio import RAW_MIN, in_thread, raw_capable, response_head, send_file, take_over
from .transferhandler import TransferHandler, small_io
from .volumes import VFSVolume

READ_CHUNK = 4 << 20
#: Seconds after a download's request ended in which its token, past its TTL, may
#: still resume it (``Range``): a client's retry after a broken connection.
DOWNLOAD_RESUME = 60.0
#: token -> [requests of it answering now, when the last one ended (monotonic)]: the
#: downloads under way (this process).
_DOWNLOADS: dict[str, list] = {}


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
            size, chunks, st, small = await small_io(self, _open_download, vol, claims, body)
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
            if body and length >= RAW_MIN and raw_capable(self):
                sock, _ = await take_over(self)
                try:
                    await in_thread(send_file, sock, response_head(status, headers), fd, start,
                                    length)
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
