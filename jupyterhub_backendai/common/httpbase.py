"""What the node daemons' HTTP servers and the hub's client for them share.

- Authentication of node-to-node calls: **mutual TLS** with certificates from the
  cluster CA (``common/certs.py``). A daemon's TLS context requires a client
  certificate signed by that CA, so a caller without one, or with one from another
  CA, is refused in the handshake; then the certificate's common name must be one
  of the daemon's ``allowed_clients`` (default ``hub``: another agent's certificate
  is refused with 403). The shared bearer token of earlier versions still works
  when a daemon has no TLS configured: **deprecated**, logged as such at start;
  a daemon with TLS ignores tokens.
- One error format: ``application/problem+json`` ``{"type", "title", "status",
  "detail", "error"}`` where ``error`` is the :class:`BackendAIError` class name,
  which :class:`NodeClient` raises again with the same status and detail.
- One client: :class:`NodeClient` (aiohttp, one keep-alive pool per daemon) for the
  hub's agent and storage clients.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import ssl
from dataclasses import dataclass, field

import aiohttp
from tornado import httputil, web
from traitlets import Dict, List, Unicode, default
from traitlets.config import Configurable

from . import bodylimit, errors
from .errors import BackendAIError, Forbidden, NotFound, Unauthorized

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"

ERRORS: dict[str, type[BackendAIError]] = {
    name: cls
    for name, cls in vars(errors).items()
    if isinstance(cls, type) and issubclass(cls, BackendAIError)
}


@dataclass
class TLSFiles:
    """A node's certificate, its key and the cluster CA that signed both ends."""

    cert: str
    key: str
    ca: str

    @classmethod
    def from_config(cls, conf: dict | None) -> TLSFiles | None:
        """``{"cert", "key", "ca"}`` (all three, or none: plain HTTP)."""
        if not conf:
            return None
        missing = [k for k in ("cert", "key", "ca") if not conf.get(k)]
        if missing:
            raise ValueError(f"TLS needs cert, key and ca; missing: {', '.join(missing)}")
        return cls(conf["cert"], conf["key"], conf["ca"])

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        ctx.verify_mode = ssl.CERT_REQUIRED  # no client certificate from the CA: no handshake
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        ctx.load_cert_chain(self.cert, self.key)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx


@dataclass
class NodeAuth:
    """How a daemon checks its callers: TLS (``tls`` set) or the deprecated token."""

    tls: TLSFiles | None = None
    token: str = ""
    allowed_clients: set[str] = field(default_factory=lambda: {"hub"})

    def check(self, request: httputil.HTTPServerRequest) -> None:
        """Raise :class:`Unauthorized`/:class:`Forbidden` unless the caller may call."""
        if self.tls is not None:
            cert = request.get_ssl_certificate()
            if not cert:  # cannot happen with CERT_REQUIRED; refuse anyway
                raise Unauthorized("a client certificate from the cluster CA is required")
            names = {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
            if not names & self.allowed_clients:
                raise Forbidden(
                    f"client certificate {', '.join(sorted(names)) or '(no name)'} may not call "
                    f"this node (allowed: {', '.join(sorted(self.allowed_clients))})"
                )
            return
        got = request.headers.get("Authorization", "")
        if not self.token or not hmac.compare_digest(got.encode(), f"Bearer {self.token}".encode()):
            raise Unauthorized("missing or wrong node token")


class NodeAuthConfig(Configurable):
    """The settings of a node daemon's API authentication, one definition for
    ``backendai-agent`` and ``backendai-storage-proxy`` (mixed into their apps, so
    they are set as ``c.AgentApp.tls``, ``c.StorageProxyApp.tls``, ...)."""

    #: Environment variable of the deprecated shared token (set by each daemon).
    token_env = ""

    token = Unicode(
        help="""DEPRECATED (use tls): shared secret the manager presents as a Bearer
        token (env BACKENDAI_AGENT_TOKEN for the agent, BACKENDAI_STORAGE_TOKEN for the
        storage proxy, where the manager's storage_proxies entry carries the same).
        Ignored when tls is set.""",
    ).tag(config=True)

    @default("token")
    def _token_default(self):
        # Read when first used, not at import: `--help-all` must not print the secret.
        return os.environ.get(self.token_env, "") if self.token_env else ""

    tls = Dict(
        help="""Mutual TLS with the cluster CA: {"cert": ".../node1.crt", "key":
        ".../node1.key", "ca": ".../cluster-ca.crt"} (made by `python -m
        jupyterhub_backendai.common.certs`). The API is then HTTPS and only callers
        with a certificate of that CA named in allowed_clients are served.""",
    ).tag(config=True)
    allowed_clients = List(
        Unicode(), ["hub"],
        help="Common names of the client certificates that may call (with tls).",
    ).tag(config=True)

    def node_auth(self) -> NodeAuth:
        """The daemon's :class:`NodeAuth`; ``ValueError`` saying what to set when
        neither TLS nor a token is configured, or the TLS files are incomplete."""
        tls = TLSFiles.from_config(self.tls)
        if tls is None and not self.token:
            raise ValueError(
                "set tls (cert, key, ca; see docs/cluster.md) or, deprecated, a token "
                f"({self.token_env} or --{type(self).__name__}.token)"
            )
        return NodeAuth(tls=tls, token=self.token, allowed_clients=set(self.allowed_clients))


def problem_json(e: BackendAIError) -> str:
    return json.dumps({
        "type": "about:blank",
        "title": e.title,
        "status": e.status_code,
        "detail": e.detail,
        "error": type(e).__name__,
    })


class NodeHandler(web.RequestHandler):
    """Base of every handler of a node daemon: authenticates in ``prepare`` and
    answers errors as problem+json. Settings: ``auth`` (a :class:`NodeAuth`)."""

    def authorized(self) -> BackendAIError | None:
        try:
            self.settings["auth"].check(self.request)
        except BackendAIError as e:
            return e
        return None

    def prepare(self):
        refused = self.authorized()
        if refused is not None:
            self.problem(refused)

    def problem(self, e: BackendAIError) -> None:
        if self._finished:
            return
        self.clear()
        self.set_status(e.status_code)
        self.set_header("Content-Type", PROBLEM)
        self.finish(problem_json(e))

    def write_error(self, status_code, **kw):
        """Errors tornado raises itself (unknown route, bad method, a crash)."""
        exc = kw.get("exc_info", (None, None, None))[1]
        if isinstance(exc, BackendAIError):
            self.problem(exc)
            return
        self.set_header("Content-Type", PROBLEM)
        title = httputil.responses.get(status_code, "Error")
        error = {400: "InvalidRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(
            status_code, ""
        )
        self.finish(json.dumps({
            "type": "about:blank", "title": title, "status": status_code,
            "detail": title if status_code >= 500 else (self._reason or title), "error": error,
        }))

    def write_json(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def body(self) -> dict:
        """The request's JSON object (400 with the reason for anything else)."""
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError as e:
            raise errors.InvalidRequest(f"the body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise errors.InvalidRequest("the body must be a JSON object")
        return data


class NotFoundHandler(NodeHandler):
    async def prepare(self):
        super().prepare()
        if not self._finished:
            self.problem(NotFound(f"no such API path {self.request.path!r}"))


def listen(app: web.Application, port: int, host: str, auth: NodeAuth, **kw):
    """Start ``app``'s server: HTTPS with client certificates when ``auth.tls``; no
    body over 1 MiB held before a handler runs (:mod:`.bodylimit`)."""
    if auth.tls is None:
        log.warning(
            "node API on %s:%s without TLS, authenticated by a shared token: DEPRECATED, "
            "make certificates (python -m jupyterhub_backendai.common.certs) and set tls",
            host, port,
        )
        return bodylimit.wrap(app.listen(port, host, **kw))
    return bodylimit.wrap(app.listen(port, host, ssl_options=auth.tls.server_context(), **kw))


class NodeClient:
    """The hub's one HTTP client for a node daemon (agent or storage proxy):
    mutual TLS with the hub's certificate, or the deprecated token; problem+json
    errors raised again as their :class:`BackendAIError` class."""

    def __init__(self, base: str, *, tls: TLSFiles | None = None, token: str = "",
                 timeout: float = 300, what: str = "node", unreachable=None):
        self.base = base.rstrip("/")
        self.tls = tls
        self.token = token
        self.timeout = timeout
        self.what = what
        self._unreachable_cls = unreachable
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token and not self.tls else {}
            ssl_ctx = self.tls.client_context() if self.tls else None
            self._session = aiohttp.ClientSession(
                headers=headers,
                connector=aiohttp.TCPConnector(ssl=ssl_ctx) if ssl_ctx else None,
                # no total: a large transfer may take long; each read may not stall
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.timeout),
            )
        return self._session

    async def raise_for(self, resp: aiohttp.ClientResponse, default=BackendAIError) -> None:
        if resp.status < 400:
            return
        kind = detail = ""
        try:
            data = await resp.json(content_type=None)
            kind, detail = data.get("error", ""), data.get("detail", "")
        except (ValueError, aiohttp.ClientError, AttributeError):
            detail = (await resp.text(errors="replace"))[:500]
        cls = ERRORS.get(kind, default)
        raise cls(detail or f"{self.what} answered {resp.status}", status_code=resp.status)

    def unreachable(self, e: Exception) -> BackendAIError:
        if self._unreachable_cls is not None:
            return self._unreachable_cls(f"{self.what} at {self.base} unreachable: {e}")
        return BackendAIError(f"{self.what} at {self.base} failed: {e}", status_code=502)

    async def call(self, method: str, path: str, *, params=None, body=None, default=BackendAIError):
        try:
            async with self.session().request(
                method, self.base + path, params=params, json=body
            ) as resp:
                await self.raise_for(resp, default)
                if resp.status == 204:
                    return None
                text = await resp.text()
                return json.loads(text) if text else None
        except (TimeoutError, aiohttp.ClientError, ssl.SSLError) as e:
            raise self.unreachable(e) from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
