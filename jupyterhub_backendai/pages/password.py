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
        try:
            error = await self._change(username, current, new)
        except web.HTTPError as e:  # throttled (429) or too many checks at once (503)
            for k, v in (getattr(e, "headers", None) or {}).items():
                self.set_header(k, v)
            return await self._page(error=f"{e.log_message} Nothing was changed.",
                                    status=e.status_code)
        if error:
            self.log.warning("password change refused for %s: %s", username, error)
            return await self._page(error=error, status=400)
        self.log.info("password changed for %s", username)
        await self._page(changed=True)

    async def _change(self, username: str, current: str, new: str) -> str:
        """The current password is checked as a login's is (manager/login.py): throttled
        per account and address, hashed on the login pool after the record's read and
        outside any transaction. It once ran bcrypt three times inside a locking
        transaction on the hub's shared pool, unthrottled: a logged-in page could guess
        the password at speed and stall every tenant's database work."""
        import asyncio

        from ..manager import tenancy
        from ..manager.login import client_address

        guard = self.authenticator.login_guard
        address = client_address(self)
        found = await self.manager.ops.password_record(username)
        key = guard.account_key(username, found and found["id"])
        guard.check_account(key, username, address)
        await guard.slow_down_if_hot(key, address)
        hashed = found["hash"] if found is not None else None
        if not await guard.check_password(current, hashed):
            guard.failed(key, address)
            if found is None:
                return ("There is no Backend.AI account for this login, so there is no "
                        "password to change.")
            return "The current password is wrong. Nothing was changed."
        if new == current:
            return "The new password is the same as the current one. Nothing was changed."
        new_hash = await asyncio.get_running_loop().run_in_executor(
            guard.executor, tenancy.hash_password, new)
        return await self.manager.ops.set_password(username, hashed, new_hash)


def _check_new(new: str, confirm: str) -> str:
    if len(new) < MIN_LENGTH:
        return f"The new password must be at least {MIN_LENGTH} characters long. Nothing was changed."
    if len(new.encode()) > MAX_BYTES:
        return f"The new password may be at most {MAX_BYTES} bytes long. Nothing was changed."
    if new != confirm:
        return "The new password and its confirmation differ. Nothing was changed."
    return ""
