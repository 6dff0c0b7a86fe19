"""The platform's own web pages inside JupyterHub's look.

Templates (Jinja) live in ``templates/``: ``page.html`` extends JupyterHub's own
``page.html`` to add our links to the navigation bar, pages under ``backendai/``
extend it. :func:`template_dir` is added to ``c.JupyterHub.template_paths`` by the
authenticator (before JupyterHub's default templates, after any the operator
set), so an operator's own ``page.html`` still wins. The spawn form is rendered
from the same directory by :func:`render` (it is a fragment JupyterHub puts
inside its ``spawn.html``).
"""

from __future__ import annotations

import os

import jinja2

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
    autoescape=True,
    enable_async=True,
    trim_blocks=True,
    lstrip_blocks=True,
)


def template_dir() -> str:
    return TEMPLATE_DIR


async def render(name: str, **context) -> str:
    """Render a fragment template of ours (not a JupyterHub page)."""
    return await _env.get_template(name).render_async(**context)


def add_template_path(app) -> None:
    """Put our templates on ``app.template_paths``: after the operator's, before
    JupyterHub's default directory (which JupyterHub appends last itself)."""
    add_template_vars(app)
    paths = getattr(app, "template_paths", None)
    if paths is None or TEMPLATE_DIR in paths:
        return
    default = app._template_paths_default()[0]
    paths = list(paths)
    if default in paths:
        paths.insert(paths.index(default), TEMPLATE_DIR)
    else:
        paths.append(TEMPLATE_DIR)
    app.template_paths = paths


def add_template_vars(app) -> None:
    """``backendai_console``: whether the navigation bar links the admin console
    (:func:`.nav.console_link`, called by JupyterHub with the user for every page)."""
    from .nav import console_link

    tv = getattr(app, "template_vars", None)
    if tv is None or "backendai_console" in tv:
        return
    app.template_vars = {**tv, "backendai_console": console_link}


def get_handlers() -> list[tuple]:
    """Routes for ``Authenticator.get_handlers`` (JupyterHub prefixes them with ``/hub``)."""
    from . import console
    from .password import PasswordHandler

    _start_usage_series()
    seg = r"([^/]+)"
    return [
        (r"/backendai/password", PasswordHandler),
        (r"/backendai/sessions", console.SessionsPage),
        (rf"/backendai/sessions/{seg}/logs", console.SessionLogsPage),
        (r"/backendai/folders", console.FoldersPage),
        (rf"/backendai/folders/{seg}", console.FolderPage),
        (r"/backendai/keys", console.KeysPage),
        (r"/backendai/dotfiles", console.DotfilesPage),
        (r"/backendai/admin/usage\.csv", console.UsageCSV),
        (r"/backendai/admin/?", console.AdminPage),
        (rf"/backendai/admin/{seg}", console.AdminPage),
    ]


def _start_usage_series() -> None:
    """Start the hub's use samples (:mod:`.usage`) once its manager exists: the routes
    are set up in the hub's running event loop, before the manager is made."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not in a hub (tests importing the routes)
        return

    async def wait_for_manager():
        from ..manager.core import BackendAIManager
        from . import usage

        while not BackendAIManager.initialized():
            await asyncio.sleep(1)
        usage.start(BackendAIManager.instance())

    loop.create_task(wait_for_manager())
