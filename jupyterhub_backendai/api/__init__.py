"""The admin REST API, served by the hub under ``<base_url>hub/api/backendai/``.

Handlers live in :mod:`.handlers` (thin), the rules and operations in
:mod:`jupyterhub_backendai.manager.access` and :mod:`...manager.admin`, the
contract in ``openapi.yaml`` (built by :mod:`.spec`). See docs/api.md.
"""

from __future__ import annotations


def get_handlers() -> list[tuple]:
    """Routes for ``Authenticator.get_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    from .handlers import routes

    table = routes()
    # Backend.AI's own routes (compat/) and vfolder invitations, before the catch-all 404
    # that routes() ends with.
    from . import spec, vfolder_invitations
    from .compat import routes as compat_routes

    invitations = vfolder_invitations.routes(spec.PREFIX.removeprefix("/hub"))
    return table[:-1] + invitations + compat_routes() + table[-1:]
