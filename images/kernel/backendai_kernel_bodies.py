"""A session's Jupyter server keeps no large request body of a client it does not know.

Tornado reads a body whole (up to the Jupyter server's ``max_body_size``, 512 MiB)
before the server authenticates the request. Every request to ``/user/<name>/...``
reaches this server through the hub's proxy, anonymous ones included: two anonymous
300 MiB POSTs would take a 512 MiB session past its memory limit, and the kernel
killed with it would take the user's unsaved work.

``backendai_bodylimit`` (the hub's ``jupyterhub_backendai/common/bodylimit.py``, copied
into the image at build time) wraps the server's HTTP server: past 1 MiB a body is
read only when the headers carry the hub's credentials for this server (the token in
``Authorization`` or, where allowed, the URL; or this server's login cookie), checked
with the hub as the server itself checks them (cached). Other bodies are dropped as
they arrive and answered with 413. The server's full authentication still runs on
every request; this only decides what is worth holding in memory.
"""

from __future__ import annotations

import urllib.parse

import backendai_bodylimit as bodylimit
from tornado import httputil
from tornado.ioloop import IOLoop
from tornado.web import decode_signed_value


def _token(serverapp, hub_auth, start_line, headers) -> str | None:
    m = hub_auth.auth_header_pat.match(headers.get(hub_auth.auth_header_name, ""))
    if m:
        return m.group(1).strip()
    if hub_auth.allow_token_in_url:
        query = urllib.parse.urlsplit(start_line.path).query
        found = urllib.parse.parse_qs(query).get("token")
        if found and found[0]:
            return found[0]
    value = httputil.parse_cookie(headers.get("Cookie", "")).get(hub_auth.cookie_name)
    secret = serverapp.web_app.settings.get("cookie_secret")
    if not value or not secret:
        return None
    token = decode_signed_value(secret, hub_auth.cookie_name, value, max_age_days=31)
    return token.decode("ascii", "replace") if token else None


def authorizer(serverapp):
    """``authorize(start_line, headers)``: whether the request's credentials give access
    to this server (the hub's answer for the token, and this server's access scopes)."""

    async def authorize(start_line, headers) -> bool:
        hub_auth = getattr(serverapp.identity_provider, "hub_auth", None)
        if hub_auth is None:
            return False  # not a JupyterHub server: nothing large from anyone unknown
        token = _token(serverapp, hub_auth, start_line, headers)
        if not token:
            return False
        user = await hub_auth.user_for_token(token, sync=False)
        return bool(user) and bool(hub_auth.check_scopes(hub_auth.access_scopes, user))

    return authorize


def _load_jupyter_server_extension(serverapp):
    # The HTTP server is made after the extensions load: wrap it once the loop runs.
    IOLoop.current().add_callback(
        bodylimit.install, serverapp, bodylimit.DEFAULT_LIMIT, authorizer(serverapp))
    serverapp.log.info("backendai: bodies over %d bytes only from clients with access",
                       bodylimit.DEFAULT_LIMIT)
