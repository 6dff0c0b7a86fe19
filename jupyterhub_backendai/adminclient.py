"""The admin API's client: signed requests (Backend.AI's HMAC-SHA256 request signing,
:mod:`.common.signing`) to a running hub's ``/hub/api/backendai``, its problem documents
turned into :class:`ApiError`, and lists read page by page. ``backendai-admin``'s API
commands (:mod:`.cli`) go through it.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.parse
from typing import Any

import aiohttp
import yarl

from .common import signing

API_PREFIX = "hub/api/backendai"

class ApiError(Exception):
    """The API answered with an error (its problem document) or could not be reached."""

    def __init__(self, status: int | None, title: str, detail: str = "") -> None:
        super().__init__(f"{status or ''} {title}: {detail}".strip())
        self.status = status
        self.title = title
        self.detail = detail


class ApiClient:
    """Signed requests to the hub's admin API (aiohttp, each call on its own loop)."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str,
                 timeout: float = 60.0) -> None:
        self.base = api_base(endpoint)
        self.access_key = access_key
        self.secret_key = secret_key
        self.timeout = timeout

    def url(self, path: str, query: dict | None = None) -> str:
        url = self.base + "/" + path.lstrip("/")
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v))
                  for k, v in (query or {}).items() if v is not None]
        if params:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
        return url

    def _send(self, method: str, path: str, query: dict | None, data: Any,
              content_type: str, sink: Any = None) -> bytes:
        """One signed request; the response body (or, with ``sink``, written to it)."""
        url = self.url(path, query)
        # The body's hash is signed too (X-BackendAI-Content-SHA256), so captured headers
        # cannot carry another body; streamed uploads cannot be hashed before sending.
        headers = signing.sign_request(method, url, self.access_key, self.secret_key,
                                       content_type=content_type,
                                       body=None if hasattr(data, "read") else (data or b""))
        # Send exactly the host[:port] that was signed.
        headers["Host"] = urllib.parse.urlsplit(url).netloc
        headers["Accept"] = "application/json"
        if hasattr(data, "read"):  # a file, streamed
            headers["Content-Length"] = str(os.fstat(data.fileno()).st_size)
        return asyncio.run(self._exchange(method.upper(), url, headers, data, sink))

    async def _exchange(self, method: str, url: str, headers: dict, data: Any,
                        sink: Any) -> bytes:
        # aiohttp: the project's one HTTP client stack (the hub's clients use it too).
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                        sock_read=self.timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http, \
                    http.request(method, yarl.URL(url, encoded=True), data=data,
                                 headers=headers) as resp:
                if resp.status >= 400:
                    raise _problem(resp.status, resp.reason or "error", await resp.read())
                if sink is None:
                    return await resp.read()
                async for chunk in resp.content.iter_chunked(1 << 20):
                    sink.write(chunk)
                return b""
        except aiohttp.ClientConnectorError as e:
            raise ApiError(None, f"cannot reach {self.base}", str(e.os_error or e)) from None
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as e:
            raise ApiError(None, f"cannot reach {self.base}", str(e) or type(e).__name__) from None

    def upload(self, path: str, query: dict, file: Any) -> Any:
        """PUT a file's bytes (streamed from the open binary ``file``)."""
        return json.loads(self._send("PUT", path, query, file, "application/octet-stream"))

    def download(self, path: str, query: dict, sink: Any) -> None:
        """GET bytes into the writable binary ``sink``."""
        self._send("GET", path, query, None, signing.DEFAULT_CONTENT_TYPE, sink)

    def request(self, method: str, path: str, *, query: dict | None = None,
                body: Any = None) -> Any:
        """Send one request; returns the decoded JSON body (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        raw = self._send(method, path, query, data, signing.DEFAULT_CONTENT_TYPE)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def list_all(self, path: str, query: dict | None = None, page: int = 100) -> dict:
        """Every item of a paginated list, following ``offset``/``limit``."""
        items: list = []
        offset = 0
        while True:
            got = self.request("GET", path, query={**(query or {}), "offset": offset, "limit": page})
            items.extend(got["items"])
            offset += len(got["items"])
            if not got["items"] or offset >= got["total"]:
                return {"items": items, "total": got["total"], "offset": 0, "limit": len(items)}


def api_base(endpoint: str) -> str:
    """The API's URL from the hub's URL (``http://host:8000/`` -> ``.../hub/api/backendai``)."""
    endpoint = endpoint.strip().rstrip("/")
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ApiError(None, "bad endpoint", f"{endpoint!r} is not an http(s) URL of the hub")
    if endpoint.endswith("/" + API_PREFIX):
        return endpoint
    return endpoint + "/" + API_PREFIX


def _problem(status: int, reason: str, raw: bytes) -> ApiError:
    title, detail = reason, ""
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict):
            title = doc.get("title") or title
            detail = doc.get("detail") or doc.get("message") or ""
    except ValueError:
        detail = raw.decode(errors="replace").strip()[:500]
    return ApiError(status, str(title), str(detail))


