"""BackendAIAuthenticator: email (or username) and password against the Backend.AI record.

Only active users of active domains log in; an inactive account gets a 403 with
a message that says so, rather than a generic failure. Superadmins become
JupyterHub admins and projects become JupyterHub groups named
``<domain>:<project>`` (``manage_groups``; project names are unique per domain only).
"""

from __future__ import annotations

import asyncio

from jupyterhub.auth import Authenticator
from tornado import web
from traitlets import Integer, Unicode, default

from .common import bodylimit
from .common.errors import BackendAIError, outage
from .common.types import UserStatus
from .manager.core import BackendAIManager


class BackendAIAuthenticator(Authenticator):
    @default("manage_groups")
    def _manage_groups_default(self):
        return True

    @default("allow_all")
    def _allow_all_default(self):
        # Who may log in is decided by the Backend.AI record (active users), not by allow lists.
        return True

    @default("login_service")
    def _login_service_default(self):
        return ""

    def __init__(self, **kw):
        super().__init__(**kw)
        # Start the manager with the hub, so that it reconciles before the hub polls servers.
        self.manager.ensure_started()
        # Our templates (navigation link, /hub/backendai/ pages) before JupyterHub's own.
        from .pages import add_template_path

        add_template_path(self.parent)
        # No body over max_request_body is held before a handler knows who sent it.
        if self.parent is not None and hasattr(self.parent, "http_server"):
            self._body_limit = asyncio.ensure_future(
                bodylimit.install(self.parent, self.max_request_body))

    max_request_body = Integer(
        bodylimit.DEFAULT_LIMIT,
        help="""Largest request body (bytes) the hub reads whole before a handler runs,
        on every route (JupyterHub's own included); larger ones are read, dropped and
        answered with 413. Uploads stream instead and are limited after authentication
        (folder quotas; 64 MiB for Backend.AI's session upload).""",
    ).tag(config=True)

    def get_handlers(self, app):
        """The admin REST API under ``<base_url>hub/api/backendai/`` (docs/api.md) and
        the pages under ``<base_url>hub/backendai/`` (jupyterhub_backendai.pages); and the
        front gate before all of JupyterHub's handlers (``hubgate``)."""
        from . import pages
        from .api import get_handlers
        from .hubgate import gate_when_built

        gate_when_built(app)
        return super().get_handlers(app) + get_handlers() + pages.get_handlers()

    @property
    def manager(self) -> BackendAIManager:
        return BackendAIManager.instance(config=self.config)

    # -- the record decides, on every request (deactivation takes effect at once) ---------

    @default("auth_refresh_age")
    def _auth_refresh_age_default(self):
        # How old the hub's idea of a user may get before refresh_user runs again. The
        # admin API also revokes tokens and cookies when it deactivates someone; this
        # catches changes made behind the hub's back (backendai-admin, SQL).
        return 60

    @default("auth_refresh_strict")
    def _auth_refresh_strict_default(self):
        # A token-authenticated request of a user whose refresh failed is refused too.
        return True

    @default("refresh_pre_spawn")
    def _refresh_pre_spawn_default(self):
        # Every spawn (the form and JupyterHub's REST API) re-checks the record first.
        return True

    async def refresh_user(self, user, handler=None):
        """The user's current record: False (log in again; tokens refused) when the
        Backend.AI user is gone, not active, or in an inactive domain; otherwise their
        admin flag and project groups as the record has them now."""
        try:
            await self.manager.ready()
            found = await self.manager.ops.hub_account(user.name)
        except Exception as e:
            # JupyterHub takes any failure here for "not logged in"; a handler of ours
            # then answers 503 instead of 401 (api/base.py) when the database is away.
            down = outage(e)
            if down is not None and handler is not None:
                handler._backendai_outage = down
            raise
        name = user.name
        if found is None:
            self.log.warning("%s: no active Backend.AI user (or domain) any more", name)
            return False
        return found

    added_user_email_domain = Unicode(
        "localhost",
        config=True,
        help="""Users added through JupyterHub's admin page (or its REST API, POST
        /hub/api/users) become Backend.AI users of the default domain and project with
        the email address ``<name>@<added_user_email_domain>`` and no password: they
        log in once an admin sets one (``backendai-admin reset-password`` or PATCH
        /hub/api/backendai/users/<id>).""",
    )

    async def add_user(self, user):
        """JupyterHub's "Add Users": make a real Backend.AI user (default domain and
        project, no usable password until one is set). A user the record already knows
        (JupyterHub calls this after every first login) is left as it is; so is every
        hub account at hub start (JupyterHub calls this for all of them): only a user
        added while the hub runs is created."""
        super().add_user(user)
        app = self.parent
        started = getattr(app, "_start_future", None)
        if started is not None and not started.done():
            return
        await self.manager.ready()
        name = user.name
        email = f"{name}@{self.added_user_email_domain}"

        try:
            made = await self.manager.ops.add_hub_user(name, email)
        except BackendAIError as e:
            raise ValueError(e.detail) from None
        if made:
            self.log.info("made Backend.AI user %r (default domain and project, no password) "
                          "for JupyterHub's Add Users", name)

    # -- login (manager/login.py: throttling, hashing on its own pool, no enumeration) --

    @property
    def login_guard(self):
        guard = getattr(self, "_login_guard", None)
        if guard is None:
            from .manager.login import LoginGuard

            guard = self._login_guard = LoginGuard(parent=self, config=self.config)
        return guard

    async def authenticate(self, handler, data):
        """Email or username and password. Throttled per account and per client address
        (429 with Retry-After); the record is read first, then the password is checked
        on the login pool (an unknown name against a dummy hash: the same work)."""
        from .common.clientaddr import client_address

        login = (data.get("username") or "").strip()
        password = data.get("password") or ""
        if not login or not password:
            return None
        guard = self.login_guard
        address = client_address(handler) if handler is not None else ""
        try:
            await self.manager.ready()
            found = await self.manager.ops.login_record(login)
        except BackendAIError as e:  # the manager could not start (its agent: e.detail)
            raise web.HTTPError(
                503, "Sessions cannot start on this hub, so nobody can log in until its "
                f"administrator fixes this: {e.detail}") from None
        except Exception as e:
            down = outage(e)
            if down is None:
                raise
            err = web.HTTPError(503, f"Cannot log in now: {down.detail}.")
            err.headers = down.headers  # Retry-After (JupyterHub's error page sends these)
            raise err from None
        key = guard.account_key(login, found and found.pop("id"))
        guard.check_account(key, login, address)
        await guard.slow_down_if_hot(key, address)
        hashed = found.pop("hash") if found is not None else None
        if not await guard.check_password(password, hashed) or found is None:
            guard.failed(key, address)
            self.log.warning("failed login for %r from %s", login, address)
            return None
        guard.succeeded(key, address)
        if found.pop("status") != UserStatus.ACTIVE:
            raise web.HTTPError(403, "This account is not active. Ask your administrator to activate it.")
        if not found.pop("domain_active"):
            raise web.HTTPError(403, "This account's domain is not active.")
        if handler is not None:
            # The right password from outside the user's allowed_client_ip: refused, and
            # said so (not "wrong password", which would send them guessing).
            from .hubgate import address_refusal

            why = await address_refusal(handler, found.get("name") or login)
            if why is not None:
                self.log.warning("login of %r refused from %s: outside allowed_client_ip",
                                 login, address)
                raise web.HTTPError(403, "%s", why)
        return found
