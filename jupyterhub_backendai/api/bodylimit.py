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
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from tornado import httputil

DEFAULT_LIMIT = 1 << 20

log = logging.getLogger(__name__)


class _Limited(httputil.HTTPMessageDelegate):
    """One request: buffered bodies over the limit are dropped and answered with 413."""

    def __init__(self, inner: httputil.HTTPMessageDelegate, conn: httputil.HTTPConnection,
                 limit: int):
        self.inner, self.conn, self.limit = inner, conn, limit
        self.buffered = False
        self.refused = False
        self.seen = 0

    def headers_received(self, start_line, headers):
        fut = self.inner.headers_received(start_line, headers)
        if fut is None:  # a handler that takes its body whole, after it is read
            self.buffered = True
            length = headers.get("Content-Length", "")
            if length.strip().isdigit() and int(length) > self.limit:
                self._refuse()
        return fut

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
        message = (f"request body too large: at most {self.limit / 2**20:g} MiB here; files "
                   "go through the streamed uploads (vfolder upload, request-upload)")
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

    def __init__(self, inner: Any, limit: int = DEFAULT_LIMIT):
        self.inner, self.limit = inner, limit

    def start_request(self, server_conn, request_conn):
        return _Limited(self.inner.start_request(server_conn, request_conn), request_conn,
                        self.limit)

    def on_close(self, server_conn):
        self.inner.on_close(server_conn)


async def install(hub: Any, limit: int = DEFAULT_LIMIT) -> None:
    """Wrap ``hub``'s HTTP server once it exists (JupyterHub makes it in ``start()``,
    after the authenticator and the manager began). Sockets the hub adds later (the
    agent network's gateway) share the server, and so the limit."""
    while getattr(hub, "http_server", None) is None:
        await asyncio.sleep(0.02)
    server = hub.http_server
    if not isinstance(server.request_callback, BodyLimit):
        server.request_callback = BodyLimit(server.request_callback, limit)
        log.info("request bodies held before a handler runs: at most %d bytes", limit)
