"""Taken-over connections: a big transfer moved by a thread of its own on the bare socket.

A PATCH body or a download of at least RAW_MIN bytes (on a plain-TCP connection) leaves
tornado's buffers: the connection is taken over (``detach``) once the request is
checked, the body is received straight into one buffer (or spliced) and written to the
staged file, a download is sent with ``sendfile`` (no copy through Python); the answer
ends the connection. Used by :mod:`.tus` and :mod:`.download`.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import struct
import threading
import weakref

from tornado import httputil, iostream, web

#: A PATCH body or a download at least this big is moved on a taken-over connection.
RAW_MIN = 256 << 10
RAW_BUF = 1 << 20  # (bigger falls out of the CPU caches: slower on this kind of VM)
#: Seconds a taken-over connection may stall before it is dropped.
RAW_TIMEOUT = 120.0
#: Transfers on taken-over connections at once; more wait for a turn.
RAW_THREADS = 128

#: RAW_THREADS slots per event loop (a semaphore belongs to one loop).
_raw_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def raw_capable(handler: web.RequestHandler) -> bool:
    """A plain-TCP HTTP/1.1 connection (TLS and anything else keep tornado's path)."""
    stream = getattr(handler.request.connection, "stream", None)
    return (type(stream) is iostream.IOStream and isinstance(stream.socket, socket.socket)
            and handler.request.version == "HTTP/1.1")


async def take_over(handler: web.RequestHandler, body: int = 0,
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


async def in_thread(fn, *args):
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


def response_head(status: int, headers: dict) -> bytes:
    """A response's status line and headers; the connection ends after it."""
    lines = [f"HTTP/1.1 {status} {httputil.responses.get(status, 'Unknown')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def answer(sock: socket.socket, status: int, headers: dict, body: bytes = b"") -> None:
    try:
        if status != 204:
            headers = dict(headers, **{"Content-Length": str(len(body))})
        sock.sendall(response_head(status, headers) + body)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client left: nothing to tell it



def receive(sock: socket.socket, fd: int, first: bytes, count: int,
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
                pwrite_all(fd, memoryview(first), at)
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
                    pwrite_all(fd, view[:n], at + written)
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
                pwrite_all(fd, memoryview(chunk), at + done)
                done += len(chunk)
            _close_pipe(pipe)
            return None
    return pipe


def pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def send_file(sock: socket.socket, head: bytes, fd: int, start: int, length: int) -> None:
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
