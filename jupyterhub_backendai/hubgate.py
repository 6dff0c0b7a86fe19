"""The hub's front gate: a check of every request before JupyterHub's routing picks a
handler (issue 22, rows 1 and 2).

- **The hub lives on the hub's host only.** In subdomain mode every user's server has a
  host of its own, ``<user>.<subdomain host>``; a page served there must not be able to
  talk to the hub as a same-origin page. So nothing under ``<base_url>hub`` is served on
  such a host: a page (GET/HEAD outside the API) is redirected to the same path on the
  hub's host, anything else answers 404; the hub's cookies that an earlier visit may
  have left on that host are cleared with the answer. Login, OAuth and token pages,
  and every hub cookie, exist only on the hub's host.
- **Cookies that a sibling host planted are refused.** A user's page can set a cookie
  for the parent domain (``Domain=<parent>``), which the browser then sends to the hub
  beside the hub's own ("cookie tossing"). Over HTTPS the packaged config names the
  hub's cookies ``__Host-...`` (``JupyterHub.cookie_host_prefix_enabled``), which a
  browser accepts only from the hub's host itself; over plain HTTP a request carrying a
  hub cookie name more than once is refused (400), and every variant of it that the hub
  can reach is cleared, so the next request carries none (docs/security.md says what
  plain HTTP cannot guarantee: a visitor with no hub cookie of their own can still be
  handed another's).

- **A user's allowed client addresses hold on every hub door** (row 7). Once JupyterHub
  has found the request's user (cookie or token), a user whose record restricts
  ``allowed_client_ip`` gets 403, with the reason in words, from any other address:
  JupyterHub's REST API (spawning included), its pages and the OAuth authorization that
  gives a user's server its cookie. The client address is the hub's one rule
  (:mod:`jupyterhub_backendai.common.clientaddr`); the gate checks and removes the
  packaged proxy's secret header before any handler sees it. Three exceptions: the
  admin and Backend.AI APIs check the address themselves (401, Backend.AI's answer);
  logging out is always allowed; and what a running server sends the hub from the
  session's own address is not refused for that address: "who is this?"
  (``GET /hub/api/user``, with which a server checks a visitor's token; it changes
  nothing) and tokens that can only identify their user, report activity and open a
  server (a server's own API token). The proxy in front of servers checks the visitor's
  address instead (``chp-guard.js``, :mod:`jupyterhub_backendai.proxy`).

The platform's authenticator arranges it (``gate_when_built``, from its ``get_handlers``),
so ``backendai-hub`` and ``jupyterhub -f jupyterhub_config.py`` both have it; it wraps the
tornado application's router, and JupyterHub's handlers run unchanged behind it.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from tornado import web
from tornado.httputil import HTTPServerRequest
from tornado.routing import Router

from .common.clientaddr import client_address, client_address_settings, from_proxy

# The hub's login and session cookies (and their __Host- forms): one of each is all a
# browser can hold for the hub. (Several ``_xsrf`` cookies on several paths are normal,
# and each is signed for the session: not counted.)
HUB_COOKIES = ("jupyterhub-hub-login", "jupyterhub-session-id")


def cookie_names(header: str) -> list[str]:
    """Every cookie name in a ``Cookie`` header, repeats included (``http.cookies``
    keeps only the last of each name)."""
    names = []
    for part in header.split(";"):
        name, sep, _ = part.strip().partition("=")
        if sep and name.strip():
            names.append(name.strip())
    return names


def _hub_cookie(name: str) -> bool:
    return name.removeprefix("__Host-") in HUB_COOKIES


class Refusal(web.RequestHandler):
    """The gate's answer: a redirect or an error, with cookies cleared."""

    def initialize(self, status: int, message: str, location: str = "",
                   clear: tuple[tuple[str, dict], ...] = ()) -> None:
        self._status, self._message, self._location, self._clear = status, message, location, clear

    def check_xsrf_cookie(self) -> None:
        """Nothing is done here that XSRF protection would guard."""

    async def prepare(self) -> None:
        # One Set-Cookie per (name, domain, path): tornado's clear_cookie keeps only the
        # last one of a name, and a browser deletes only the exact triple it holds.
        for name, kw in self._clear:
            header = f"{name}=; Expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=0; Path={kw['path']}"
            if kw.get("domain"):
                header += f"; Domain={kw['domain']}"
            if kw.get("secure"):
                header += "; Secure"
            self.add_header("Set-Cookie", header)
        self.set_header("Cache-Control", "no-store")
        if self._location:
            self.redirect(self._location, status=self._status)
            return
        self.set_status(self._status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": self._status, "message": self._message}))


class HubGate(Router):
    """Checks a request, then hands it to JupyterHub's router or to ``Refusal``."""

    def __init__(self, app: web.Application, inner: Router, *, base_url: str,
                 hub_origin: str, subdomain_host: str):
        self.app = app
        self.inner = inner
        self.hub_prefix = base_url.rstrip("/") + "/hub"
        self.hub_origin = hub_origin.rstrip("/")
        self.hub_host = (urlsplit(hub_origin).hostname or "").lower()
        self.user_domain = (urlsplit(subdomain_host).hostname or "").lower() if subdomain_host else ""
        self.base_url = base_url

    def find_handler(self, request: HTTPServerRequest, **kwargs):
        # Whether the packaged proxy sent it: decided now, and its secret header removed.
        from_proxy(request, client_address_settings(self.app.settings.get("config")))
        refusal = self.check(request)
        if refusal is not None:
            return self.app.get_handler_delegate(request, Refusal, refusal)
        delegate = self.inner.find_handler(request, **kwargs)
        handler_class = getattr(delegate, "handler_class", None)
        if handler_class is not None:
            delegate.handler_class = address_checked(handler_class)
        return delegate

    def _on_hub(self, path: str) -> bool:
        return path == self.hub_prefix or path.startswith(self.hub_prefix + "/")

    def users_host(self, host: str) -> bool:
        """A user's server's host: ``<something>.<subdomain host>``, not the hub's."""
        host = host.lower()
        return bool(self.user_domain) and host != self.hub_host and \
            host.endswith("." + self.user_domain)

    def _clearing(self, names, host_only_too: bool = True) -> tuple[tuple[str, dict], ...]:
        """Every (name, domain, path) under which the hub's host or a sibling may have
        set ``names``: host-only and for the hub's parent domains, on ``/``, the base
        URL and the hub's prefix."""
        paths = {"/", self.base_url, self.hub_prefix + "/"}
        domains: list[str | None] = [None] if host_only_too else []
        try:
            ipaddress.ip_address(self.hub_host)
        except ValueError:  # a name: the host itself and its parents, not the top level
            labels = self.hub_host.split(".")
            domains += [".".join(labels[i:]) for i in range(max(len(labels) - 1, 1))]
        out = []
        for name in names:
            for d in domains:
                if name.startswith("__Host-") and d is not None:
                    continue  # a __Host- cookie has no Domain (and the browser refuses one)
                for p in paths:
                    if name.startswith("__Host-") and p != "/":
                        continue
                    kw: dict = {"path": p}
                    if d is not None:
                        kw["domain"] = d
                    if name.startswith("__Host-"):
                        kw["secure"] = True
                    out.append((name, kw))
        return tuple(out)

    def check(self, request: HTTPServerRequest) -> dict | None:
        path = request.path
        if self.users_host(request.host_name) and self._on_hub(path):
            here = tuple((n, {"path": p}) for n in (*HUB_COOKIES, "_xsrf")
                         for p in ("/", self.base_url, self.hub_prefix + "/"))
            api = path.startswith(self.hub_prefix + "/api/") or path == self.hub_prefix + "/api"
            if request.method in ("GET", "HEAD") and not api:
                return {"status": 302, "message": "", "clear": here,
                        "location": self.hub_origin + request.uri}
            return {"status": 404, "clear": here,
                    "message": "the hub is not served on a user's host: use "
                               f"{self.hub_origin}{self.hub_prefix}/"}
        names = [n for n in cookie_names(request.headers.get("Cookie", "")) if _hub_cookie(n)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            return {"status": 400, "clear": self._clearing(repeated),
                    "message": "this request carries the hub's cookie "
                               f"{', '.join(repeated)} more than once (one was set by another "
                               "site under this domain): both are cleared; log in again"}
        return None


# Scopes of tokens that only identify a user, report activity and open a server: what a
# running server sends the hub from the session's address (its own token; the OAuth
# tokens of its visitors, which it checks with the hub).
SERVER_SCOPES = frozenset({"access:servers", "users:activity", "read:users:name",
                           "read:users:groups", "read:users:activity"})
_CHECKED: dict[type, type] = {}


def _server_token(handler) -> bool:
    if handler.get_auth_token() is None:
        return False  # the login cookie: always checked
    scopes = getattr(handler, "expanded_scopes", None) or set()
    return bool(scopes) and all(s.split("!", 1)[0] in SERVER_SCOPES for s in scopes)


async def address_refusal(handler, username: str) -> str | None:
    """Why ``username`` may not act from this request's client address (their
    ``allowed_client_ip``), in words; None when they may. The record is cached for a
    few seconds (``c.KeypairAuth.lookup_cache_ttl``)."""
    from .api.keypair_auth import address_refusal as refusal
    from .api.keypair_auth import keypair_auth
    from .common.errors import outage

    manager = getattr(getattr(handler, "authenticator", None), "manager", None)
    if manager is None:
        return None
    try:
        record = await keypair_auth(manager).hub_user_record(username)
    except Exception as e:
        down = outage(e)
        if down is None:
            raise
        err = web.HTTPError(503, f"Cannot check where you connect from now: {down.detail}.")
        err.headers = down.headers  # type: ignore[attr-defined]
        raise err from None
    why = refusal(client_address(handler), record)
    if why is None:
        return None
    return f"Not allowed from this address: {why} (its allowed_client_ip)."


def address_checked(cls: type) -> type:
    """``cls``, or a subclass of it (one per class) whose ``prepare`` refuses (403) a
    user acting from outside their ``allowed_client_ip`` once JupyterHub found the user."""
    done = _CHECKED.get(cls)
    if done is not None:
        return done
    from jupyterhub.apihandlers.users import SelfAPIHandler
    from jupyterhub.handlers.base import BaseHandler
    from jupyterhub.handlers.login import LogoutHandler

    from .api.base import APIBase

    if (not isinstance(cls, type) or not issubclass(cls, BaseHandler)
            or issubclass(cls, (APIBase, LogoutHandler, SelfAPIHandler))):
        _CHECKED[cls] = cls
        return cls

    async def prepare(self):
        await cls.prepare(self)
        if self._finished:
            return
        user = self.current_user
        if user is None or getattr(user, "kind", "user") != "user" or _server_token(self):
            return
        why = await address_refusal(self, user.name)
        if why is not None:
            self.log.warning("refused %s %s for %s: %s", self.request.method,
                             self.request.path, user.name, why)
            raise web.HTTPError(403, "%s", why)

    checked = type(cls.__name__, (cls,), {"prepare": prepare, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
    _CHECKED[cls] = checked
    return checked


def install(hub) -> None:
    """Put the gate in front of ``hub.tornado_application`` (a JupyterHub app)."""
    app = hub.tornado_application
    public = urlsplit(hub.public_url or hub.subdomain_host or hub.bind_url)
    app.default_router = HubGate(app, app.default_router, base_url=hub.base_url,
                                 hub_origin=f"{public.scheme}://{public.netloc}",
                                 subdomain_host=hub.subdomain_host)


def gate_when_built(hub) -> None:
    """Have ``hub`` (a JupyterHub app, while it sets up its handlers) put the gate in
    front of its tornado application as soon as it makes it. JupyterHub asks the
    authenticator for handlers (``get_handlers``) right before ``init_tornado_application``,
    and gives extensions no later hook; the authenticator calls this from there."""
    make = getattr(hub, "init_tornado_application", None)
    if make is None or getattr(make, "gated", False):
        return

    def init_tornado_application():
        make()
        install(hub)
        from . import sessiontokens

        sessiontokens.start(hub)  # a server's tokens die with its session

    init_tornado_application.gated = True  # type: ignore[attr-defined]
    hub.init_tornado_application = init_tornado_application
