"""BackendAIAuthenticator: email (or username) and password against the Backend.AI record.

Only active users of active domains log in; an inactive account gets a 403 with
a message that says so, rather than a generic failure. Superadmins become
JupyterHub admins and projects become JupyterHub groups named
``<domain>.<project>`` (``manage_groups``; project names are unique per domain only).
"""

from __future__ import annotations

from jupyterhub.auth import Authenticator
from tornado import web
from traitlets import default

from .common.types import UserRole, UserStatus
from .manager import tenancy
from .manager.core import BackendAIManager
from .models import Domain


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

    def get_handlers(self, app):
        """The admin REST API under ``<base_url>hub/api/backendai/`` (docs/api.md)."""
        from .api import get_handlers

        return super().get_handlers(app) + get_handlers()

    @property
    def manager(self) -> BackendAIManager:
        return BackendAIManager.instance(config=self.config)

    async def authenticate(self, handler, data):
        login = (data.get("username") or "").strip()
        password = data.get("password") or ""
        if not login or not password:
            return None
        await self.manager.ready()

        def check(s):
            user = tenancy.find_user(s, login)
            if user is None or not tenancy.check_password(password, user.password):
                return None
            domain = s.get(Domain, user.domain_name)
            return {
                "name": user.username,
                "status": user.status,
                "domain_active": bool(domain and domain.is_active),
                "admin": user.role == UserRole.SUPERADMIN,
                "groups": sorted(f"{p.domain_name}.{p.name}" for p in user.projects if p.is_active),
                "auth_state": {"email": user.email, "role": user.role, "domain": user.domain_name},
            }

        found = await self.manager.db(check)
        if found is None:
            self.log.warning("failed login for %r", login)
            return None
        if found.pop("status") != UserStatus.ACTIVE:
            raise web.HTTPError(403, "This account is not active. Ask your administrator to activate it.")
        if not found.pop("domain_active"):
            raise web.HTTPError(403, "This account's domain is not active.")
        return found
