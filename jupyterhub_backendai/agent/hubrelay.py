"""The hub's API on the agent network's gateway, for kernels (:func:`serve_hub_api_on`).

A hub whose API listens on loopback only is out of the kernels' reach: inside the hub
process, the embedded agent makes the same API listen on its network's gateway too, and
nowhere else.
"""

from __future__ import annotations

import asyncio

# (gateway, port) pairs the hub's API listens on in this process (agents share them).
_HUB_LISTENING: set[tuple[str, int]] = set()


async def serve_hub_api_on(address: str, log) -> None:
    """Inside a hub whose API listens on loopback only: make it listen on ``address``
    (the agent network's gateway) too, once the hub's HTTP server exists. Kernels
    reach the API there; it listens nowhere else. Outside a hub, or when the hub's
    API listens on another address (the operator's choice), nothing is done."""
    import sys
    from urllib.parse import urlsplit

    from tornado.netutil import bind_sockets

    app_mod = sys.modules.get("jupyterhub.app")
    if app_mod is None or not app_mod.JupyterHub.initialized():
        return
    hub = app_mod.JupyterHub.instance()
    if hub.hub_bind_url:
        bind = urlsplit(hub.hub_bind_url)
        if bind.scheme not in ("http", "https"):
            return  # a unix socket: nothing to add
        host, port = bind.hostname, bind.port
    else:
        host, port = hub.hub_ip, hub.hub_port
    if host not in ("127.0.0.1", "localhost", "::1"):
        return
    key = (address, port)
    if key in _HUB_LISTENING:
        return
    _HUB_LISTENING.add(key)
    # Listen at once: the hub makes its HTTP server in start(), after the manager (and
    # this agent) began, and a kernel adopted from before a restart may call the API in
    # between. The kernel's connection waits in the socket's backlog until the server
    # takes the socket over, instead of being refused.
    try:
        sockets = bind_sockets(port, address=address)
    except OSError as e:
        _HUB_LISTENING.discard(key)
        log.error("the hub's API could not listen on %s:%s, kernels will not reach it: %s",
                  address, port, e)
        return
    while getattr(hub, "http_server", None) is None:
        await asyncio.sleep(0.05)
    hub.http_server.add_sockets(sockets)
    log.info("hub API also listening on %s:%s (the agent network's gateway, for kernels)",
             address, port)
