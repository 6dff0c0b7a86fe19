"""No request body is held before its sender is known.

Tornado reads a request's whole body into memory (up to its ``max_body_size``,
100 MiB) before a handler's ``prepare`` runs, that is before anyone is
authenticated: a few anonymous clients could make the hub hold gigabytes, on any
route, JupyterHub's own included. :func:`install` wraps the hub's HTTP server so
that a buffered body larger than :data:`DEFAULT_LIMIT` is read and dropped as it
arrives (memory stays flat) and answered with a 413 that says why.

Handlers that take large bodies stream them (``@web.stream_request_body``): tornado
calls their ``prepare`` before the body, they authenticate there and raise the
connection's limit for that request only (the vfolder and storage uploads,
Backend.AI's session upload). Those pass through untouched.

The node daemons (agent, storage proxy, its public transfer port included) wrap their
servers with :func:`wrap` when they listen. The kernel image wraps each session's Jupyter server the same way (the image's build
copies this file in as ``backendai_bodylimit``), with an ``authorize`` callback: a body
over the limit is read there only from a client with the hub's credentials for that
server (JupyterLab saves notebooks and uploads files of several MiB in one request).
This module therefore imports nothing but the standard library and tornado.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tornado import httputil

DEFAULT_LIMIT = 1 << 20

log = logging.getLogger(__name__)


Authorize = Callable[[httputil.RequestStartLine, httputil.HTTPHeaders], Awaitable[bool]]


class _Limited(httputil.HTTPMessageDelegate):
    """One request: buffered bodies over the limit are dropped and answered with 413,
    unless ``authorize`` (asked once the headers are in) knows the sender."""

    def __init__(self, inner: httputil.HTTPMessageDelegate, conn: httputil.HTTPConnection,
                 limit: int, authorize: Authorize | None):
        self.inner, self.conn, self.limit, self.authorize = inner, conn, limit, authorize
        self.buffered = False
        self.refused = False
        self.seen = 0

    def headers_received(self, start_line, headers):
        fut = self.inner.headers_received(start_line, headers)
        if fut is not None:  # a streamed handler: it authenticates before it reads
            return fut
        self.buffered = True  # a handler that takes its body whole, after it is read
        length = headers.get("Content-Length", "").strip()
        if length.isdigit():
            big = int(length) > self.limit
        else:
            big = "chunked" in headers.get("Transfer-Encoding", "").lower()
        if not big:
            return None
        if self.authorize is None:
            if length:
                self._refuse()
            return None  # chunked: counted as it arrives
        return self._ask(start_line, headers)

    async def _ask(self, start_line, headers) -> None:
        try:
            known = await self.authorize(start_line, headers)
        except Exception:
            log.exception("deciding whether to read a large body")
            known = False
        if known:
            self.buffered = False  # the server's own maximum applies
        else:
            self._refuse()

    def _refuse(self) -> None:
        self.refused = True
        # The inner delegate drops what it buffered so far; it is never finished.
        self.inner.on_connection_close()

    def data_received(self, chunk):
        if self.buffered and not self.refused:
            self.seen += len(chunk)
            if self.seen > self.limit:
                self._refuse()
        if self.refused:
            return None
        return self.inner.data_received(chunk)

    def finish(self):
        if not self.refused:
            return self.inner.finish()
        # Answered after the body was read (and dropped): answering first would make the
        # client see a reset connection instead of the reason.
        mib = f"{self.limit / 2**20:g} MiB"
        message = (f"request body too large: at most {mib} here; files go through the "
                   "streamed uploads (vfolder upload, request-upload)"
                   if self.authorize is None else
                   f"request body over {mib} from a client this server does not know: "
                   "send it with your credentials (log in, or a token with access to "
                   "this server)")
        # RFC 9457 as the admin API answers, and JupyterHub's API's "message"
        body = json.dumps({"type": "about:blank", "title": "Payload Too Large", "status": 413,
                           "detail": message, "message": message}).encode()
        self.conn.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", 413, "Payload Too Large"),
            httputil.HTTPHeaders({"Content-Type": "application/problem+json",
                                  "Content-Length": str(len(body)), "Connection": "close"}),
            body)
        self.conn.finish()

    def on_connection_close(self):
        if not self.refused:
            self.inner.on_connection_close()


class BodyLimit(httputil.HTTPServerConnectionDelegate):
    """Wraps an HTTP server's request callback (the tornado application)."""

    def __init__(self, inner: Any, limit: int = DEFAULT_LIMIT,
                 authorize: Authorize | None = None):
        self.inner, self.limit, self.authorize = inner, limit, authorize

    def start_request(self, server_conn, request_conn):
        return _Limited(self.inner.start_request(server_conn, request_conn), request_conn,
                        self.limit, self.authorize)

    def on_close(self, server_conn):
        self.inner.on_close(server_conn)


async def install(app: Any, limit: int = DEFAULT_LIMIT,
                  authorize: Authorize | None = None) -> None:
    """Wrap ``app``'s HTTP server (``app.http_server``) once it exists: JupyterHub makes
    it in ``start()``, after the authenticator and the manager began; a Jupyter server
    after its extensions loaded. Sockets added to the server later (the hub's on the
    agent network's gateway) share it, and so the limit."""
    while (server := getattr(app, "http_server", None)) is None:
        await asyncio.sleep(0.02)
    wrap(server, limit, authorize)
    log.info("request bodies held before a handler runs: at most %d bytes%s", limit,
             " from unknown clients" if authorize else "")


def wrap(server: Any, limit: int = DEFAULT_LIMIT, authorize: Authorize | None = None):
    """Limit what ``server`` (a tornado ``HTTPServer``) holds before its handlers run;
    returns it. The node daemons' servers (agent, storage proxy) are wrapped this way
    when they start listening."""
    if not isinstance(server.request_callback, BodyLimit):
        server.request_callback = BodyLimit(server.request_callback, limit, authorize)
    return server
