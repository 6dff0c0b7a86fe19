"""``/hub/backendai/password``: every user changes their own Backend.AI password.

GET shows the form, POST takes the current password, the new one and its
confirmation. The POST is XSRF-checked by JupyterHub's BaseHandler (as its own
pages are). Nothing changes unless every check passes.
"""

from __future__ import annotations

from jupyterhub.handlers import BaseHandler
from tornado import web

from ..manager.core import BackendAIManager

MIN_LENGTH = 8
MAX_BYTES = 72  # bcrypt's limit


class PasswordHandler(BaseHandler):
    @property
    def manager(self) -> BackendAIManager:
        return BackendAIManager.instance(config=self.settings.get("config"))

    async def _page(self, *, error: str = "", changed: bool = False, status: int = 200) -> None:
        self.set_status(status)
        html = await self.render_template(
            "backendai/password.html", error=error, changed=changed, min_length=MIN_LENGTH
        )
        self.finish(html)

    @web.authenticated
    async def get(self):
        await self._page()

    @web.authenticated
    async def post(self):
        current = self.get_body_argument("current", "")
        new = self.get_body_argument("new", "")
        confirm = self.get_body_argument("confirm", "")
        error = _check_new(new, confirm)
        if error:
            return await self._page(error=error, status=400)
        await self.manager.ready()
        username = self.current_user.name

        error = await self.manager.ops.change_password(username, current, new)
        if error:
            self.log.warning("password change refused for %s: %s", username, error)
            return await self._page(error=error, status=400)
        self.log.info("password changed for %s", username)
        await self._page(changed=True)


def _check_new(new: str, confirm: str) -> str:
    if len(new) < MIN_LENGTH:
        return f"The new password must be at least {MIN_LENGTH} characters long. Nothing was changed."
    if len(new.encode()) > MAX_BYTES:
        return f"The new password may be at most {MAX_BYTES} bytes long. Nothing was changed."
    if new != confirm:
        return "The new password and its confirmation differ. Nothing was changed."
    return ""
