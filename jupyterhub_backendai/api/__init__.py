"""The admin REST API, served by the hub under ``<base_url>hub/api/backendai/``.

Handlers live in :mod:`.handlers` (thin), the rules and operations in
:mod:`jupyterhub_backendai.manager.access` and :mod:`...manager.admin`, the
contract in ``openapi.yaml`` (built by :mod:`.spec`). See docs/api.md.
"""

from __future__ import annotations


def api_routes() -> list:
    """Every route of the admin API (:class:`.spec.Route`), each declared once with its
    operations: the handlers', the vfolders', the vfolder invitations' and the warm
    pools'. The tornado URL list below and
    the OpenAPI document (:func:`.document.build_document`) are both made from these."""
    from .handlers import ROUTES
    from .vfolder_invitations import ROUTES as INVITATIONS
    from .vfolders import ROUTES as VFOLDERS
    from .warmpools import ROUTES as WARM_POOLS

    return ROUTES + VFOLDERS + INVITATIONS + WARM_POOLS


def get_handlers() -> list[tuple]:
    """Routes for ``Authenticator.get_handlers`` (JupyterHub prefixes them with ``/hub``):
    the admin API's, Backend.AI's own (compat/, not part of the document), then the
    catch-all 404."""
    from . import spec
    from .base import NotFoundHandler
    from .compat import routes as compat_routes

    base = spec.PREFIX.removeprefix("/hub")
    return ([r.rule(base) for r in api_routes()] + compat_routes()
            + [(base + r"(?:/.*)?", NotFoundHandler)])
