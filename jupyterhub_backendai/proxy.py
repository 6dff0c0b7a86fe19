"""The hub's proxy: JupyterHub's ConfigurableHTTPProxy, with each user's allowed client
addresses in the routes to their servers (issue 22, row 7).

A user whose record restricts ``allowed_client_ip`` must not be served by their own
server from another address, whichever credential the visitor holds (the server's
cookie, a token). The hub never sees those requests: configurable-http-proxy sends them
straight to the server. So the check lives in the proxy: every route to a user's server
carries the user's list in its data (:data:`ALLOWED_KEY`), and the packaged proxy
(``share/chp-guard.js``) answers 403 to a request from outside it. The list is read from
the record when the route is added and then every ``client_policy_interval`` seconds for
every routed user (one query); a changed list is written into the routes at once, so a
policy change reaches running servers within seconds.

We chose route data over asking the hub per request: the proxy decides with what it
already holds (no hub round trip on a server's hot path, and a hub that is restarting
does not stop servers), and the routes are the proxy's own record of whose server is
where. JupyterHub's ``check_routes`` compares targets only, hence the refresh here.
"""

from __future__ import annotations

import asyncio
import ipaddress

from jupyterhub.proxy import ConfigurableHTTPProxy
from traitlets import Float
from traitlets.config import LoggingConfigurable

ALLOWED_KEY = "backendai_allowed_client_ip"


def normalized(allowed) -> tuple[str, ...]:
    """``allowed_client_ip`` as the proxy reads it: networks in CIDR form, sorted; entries
    that are neither an address nor a network are left out (the hub skips them too)."""
    out = set()
    for item in allowed or ():
        try:
            out.add(str(ipaddress.ip_network(str(item).strip(), strict=False)))
        except (ValueError, TypeError):
            continue
    return tuple(sorted(out))


class ClientPolicyRoutes(LoggingConfigurable):
    """Mixin for a JupyterHub proxy class (before it in the bases): users' routes carry
    their allowed addresses (``c.ClientPolicyRoutes.*`` configures every such class)."""

    client_policy_interval = Float(
        2.0,
        config=True,
        help="""Seconds between reads of the allowed_client_ip of users with a routed
        server (one query); a change reaches their routes, so the proxy refuses other
        addresses, within this time.""",
    )

    def _policy_state(self):
        state = self.__dict__.get("_bai_policy")
        if state is None:
            # routespec -> [target, data (without the list), list pushed]
            state = self.__dict__["_bai_policy"] = {"routes": {}, "task": None}
        return state

    @property
    def _bai_manager(self):
        from .manager.core import BackendAIManager

        return BackendAIManager.instance(config=self.config)

    async def _allowlists(self, names) -> dict[str, tuple[str, ...]]:
        manager = self._bai_manager
        await manager.ready()
        found = await manager.ops.client_ip_allowlists(sorted(names))
        return {name: normalized(ips) for name, ips in found.items()}

    async def add_route(self, routespec, target, data):
        data = dict(data or {})
        data.pop(ALLOWED_KEY, None)
        user = data.get("user")
        if not user:
            return await super().add_route(routespec, target, data)
        state = self._policy_state()
        allowed = (await self._allowlists([user])).get(user, ())
        state["routes"][routespec] = [target, data, allowed]
        self._start_policy_loop()
        return await super().add_route(routespec, target, self._with_policy(data, allowed))

    async def delete_route(self, routespec):
        self._policy_state()["routes"].pop(routespec, None)
        return await super().delete_route(routespec)

    @staticmethod
    def _with_policy(data: dict, allowed: tuple[str, ...]) -> dict:
        return {**data, ALLOWED_KEY: list(allowed)} if allowed else dict(data)

    def _start_policy_loop(self) -> None:
        state = self._policy_state()
        task = state["task"]
        if task is None or task.done():
            state["task"] = asyncio.ensure_future(self._policy_loop())

    async def _policy_loop(self) -> None:
        while True:
            await asyncio.sleep(self.client_policy_interval)
            try:
                await self.refresh_client_policies()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the database away: keep what the routes carry
                self.log.warning("reading users' allowed_client_ip failed: %s", e)

    async def refresh_client_policies(self) -> int:
        """Write changed ``allowed_client_ip`` lists into the routes; how many changed."""
        routes = self._policy_state()["routes"]
        if not routes:
            return 0
        names = {entry[1]["user"] for entry in routes.values()}
        lists = await self._allowlists(names)
        changed = 0
        for spec, entry in list(routes.items()):
            target, data, pushed = entry
            wanted = lists.get(data["user"], ())
            if wanted == pushed or routes.get(spec) is not entry:
                continue
            entry[2] = wanted
            changed += 1
            self.log.info("allowed_client_ip of %s changed: updating route %s", data["user"], spec)
            await super().add_route(spec, target, self._with_policy(data, wanted))
            now = routes.get(spec)
            if now is None:
                # Deleted while we wrote it: make sure our write did not bring it back.
                await super().delete_route(spec)
            elif now is not entry:
                # Re-added meanwhile (a restart): its own write wins, with the new list.
                await super().add_route(spec, now[0], self._with_policy(now[1], now[2]))
        return changed

    def stop(self):
        # Synchronous, as JupyterHub's Proxy.stop (the app front's stop calls it so).
        task = self._policy_state()["task"]
        if task is not None:
            task.cancel()
        return super().stop()


class BackendAIProxy(ClientPolicyRoutes, ConfigurableHTTPProxy):
    """configurable-http-proxy (through ``share/chp-guard.js``) with users' allowed client
    addresses in their routes."""
