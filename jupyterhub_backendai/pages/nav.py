"""Whether the navigation bar shows the admin console's link to the person logged in.

JupyterHub renders its page templates with ``template_vars``; a callable there is
called with the user for every page (its own pages and error pages included, which
render synchronously). The answer is the user's Backend.AI role (superadmin or domain
admin), kept for :data:`TTL` seconds per user so that a page costs no database read
most of the time; the pages under ``/hub/backendai/`` refresh it whenever they load
the caller. The link is only a convenience: the console checks the role itself.
"""

from __future__ import annotations

import threading
import time

from ..common.types import UserRole

TTL = 30.0
_CONSOLE_ROLES = (UserRole.SUPERADMIN, UserRole.ADMIN)
_cache: dict[str, tuple[float, bool]] = {}
_lock = threading.Lock()


def remember(username: str, role: str) -> None:
    with _lock:
        _cache[username] = (time.monotonic(), role in _CONSOLE_ROLES)


def console_link(user) -> bool:
    """True for superadmins (JupyterHub admins) and domain admins."""
    if user is None:
        return False
    if getattr(user, "admin", False):
        return True
    name = getattr(user, "name", None)
    if not name:
        return False
    now = time.monotonic()
    hit = _cache.get(name)
    if hit is not None and now - hit[0] < TTL:
        return hit[1]
    role = None
    try:
        from ..manager.core import BackendAIManager
        from ..manager.pageviews import console_role_now

        if not BackendAIManager.initialized():
            return False
        # The manager's read-only operation, run at once (a template variable is called
        # while the page renders, so it cannot wait): one indexed row.
        role = console_role_now(BackendAIManager.instance(), name)
    except Exception:
        role = None
    remember(name, role or "")
    return _cache[name][1]
