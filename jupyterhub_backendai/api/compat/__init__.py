"""Backend.AI's own client API, spoken by the hub (see docs/backendai-compat.md).

The official ``backend.ai`` CLI and SDK (``backend.ai-client`` 23.09) talk to

    BACKEND_ENDPOINT=<hub URL>/hub/api/backendai

the same prefix as the hub's admin API: Backend.AI's routes (``GET /``,
``/manager/announcement``, ``/session``, ``/folders``, ``/admin/gql``) do not
collide with ours (``/sessions``, ``/vfolders``, ...). Requests are signed with a
keypair exactly as for the admin API (:mod:`..keypair_auth`), and every operation
goes through the same services (:mod:`...manager.admin`, :mod:`...manager.vfolders`,
the manager's ``enqueue``/``destroy_session``), so the access rules are the same.
"""

from __future__ import annotations


def routes() -> list[tuple]:
    """(pattern, handler[, kwargs]) relative to the hub prefix, before the API's 404 catch-all."""
    from .handlers import routes as _routes

    return _routes()
