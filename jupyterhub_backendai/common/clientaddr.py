"""Where a request comes from: one rule for the whole hub (issue 22, row 7).

JupyterHub runs tornado with ``xheaders``, so ``request.remote_ip`` is whatever a client
writes into ``X-Real-Ip`` or ``X-Forwarded-For``. :func:`client_address` ignores that: it
starts from the socket's peer and reads ``X-Forwarded-For`` only from a proxy it can
tell from any other program on the machine:

- **The packaged proxy** (configurable-http-proxy run through ``share/chp-guard.js``)
  marks every request it forwards to the hub with the header :data:`SECRET_HEADER`
  carrying ``ClientAddress.proxy_secret``, a random value the packaged config makes at
  every start and hands to the proxy only (through its environment). The proxy removes
  that header from every request a client sends, whatever its route, so neither a client
  nor a user's server ever sees or forges it. A request from one of ``proxy_addresses``
  (loopback) with the right secret (compared in constant time) is the proxy's. A bare
  loopback peer is not: a kernel of the local backend, a container on the host network,
  any process of the host can connect to the hub's port straight and write any
  ``X-Forwarded-For``; such a request's address is its socket peer's.
- **Proxies the operator names** in ``ClientAddress.trusted_proxies`` (for a proxy that
  connects to the hub directly and cannot send the secret): their header is believed
  from their address alone, as before.

Of a believed header, only the ``trusted_proxy_hops`` entries the proxies appended count
(a proxy appends the address it was connected from, so entries further left are the
client's own words). ``X-Real-Ip`` is never read.

This module imports nothing of the web layer or the manager, so that the API, the
authenticator, the login guard and the hub's front gate all use this one function.
"""

from __future__ import annotations

import hmac
import ipaddress

from traitlets import Integer, List, Unicode
from traitlets.config import Configurable

# The header the packaged proxy puts on requests for the hub (chp-guard.js: the same name).
SECRET_HEADER = "X-Backendai-Proxy-Secret"
# The environment variable that hands the secret to the proxy (and only to it).
SECRET_ENV = "BACKENDAI_PROXY_SECRET"
# Set on a tornado request by the hub's gate once it has checked and removed the header.
_VERDICT = "_backendai_from_proxy"


def _ip(text: str | None):
    try:
        addr = ipaddress.ip_address((text or "").strip().strip("[]"))
    except ValueError:
        return None
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def _networks(items, trait: str) -> list:
    parsed = []
    for item in items:
        try:
            parsed.append(ipaddress.ip_network(str(item).strip(), strict=False))
        except ValueError:
            raise ValueError(f"ClientAddress.{trait}: {item!r} is not an address or network") from None
    return parsed


class ClientAddress(Configurable):
    """Where a request comes from: the socket's peer, or what a proxy we can tell says."""

    proxy_secret = Unicode(
        "",
        help="""The secret the packaged configurable-http-proxy (share/chp-guard.js) puts in
        the X-Backendai-Proxy-Secret header of every request it forwards to the hub. The
        packaged config makes a random one at every start and hands it to the proxy through
        its environment (BACKENDAI_PROXY_SECRET); set it yourself only when you start that
        proxy yourself with the same value. Empty: no request is the packaged proxy's.""",
    ).tag(config=True)
    proxy_addresses = List(
        Unicode(),
        default_value=["127.0.0.1/32", "::1/128"],
        help="""Addresses or networks (CIDR) the packaged proxy connects to the hub from
        (JupyterHub.hub_connect_ip: loopback). A request from them is the proxy's only
        when it carries proxy_secret; without it, its address is its socket peer's.""",
    ).tag(config=True)
    trusted_proxies = List(
        Unicode(),
        default_value=[],
        help="""Addresses or networks (CIDR) of proxies you run that connect to the hub
        directly and cannot send proxy_secret (an external configurable-http-proxy, a
        load balancer in front of the hub itself): their X-Forwarded-For is believed from
        their address alone. Any program that can connect from such an address can name
        any client address: never list loopback or a network where kernels or users run
        programs. Empty (the default): only the packaged proxy, by its secret.""",
    ).tag(config=True)
    trusted_proxy_hops = Integer(
        1,
        help="""How many X-Forwarded-For entries, counted from the right, were appended by
        trusted proxies: 1 for configurable-http-proxy alone (it appends the address of
        whoever connected to it), 2 for a reverse proxy (nginx, a load balancer) in front
        of it that appends one entry too. The client address is that entry; anything to
        its left was written by the client and is ignored.""",
    ).tag(config=True)

    def _parsed(self, trait: str) -> list:
        cache = self.__dict__.setdefault("_nets_cache", {})
        value = list(getattr(self, trait))
        hit = cache.get(trait)
        if hit is None or hit[0] != value:
            hit = cache[trait] = (value, _networks(value, trait))
        return hit[1]

    def networks(self) -> list:
        """The parsed ``trusted_proxies``."""
        return self._parsed("trusted_proxies")

    def trusted(self, ip: str) -> bool:
        """Is ``ip`` one of the operator's ``trusted_proxies`` (believed without a secret)?"""
        addr = _ip(ip)
        return addr is not None and any(addr in net for net in self.networks())

    def secret_matches(self, peer: str, presented: str | None) -> bool:
        """Is a request from ``peer`` carrying ``presented`` the packaged proxy's?"""
        if not self.proxy_secret or not presented:
            return False
        addr = _ip(peer)
        if addr is None or not any(addr in net for net in self._parsed("proxy_addresses")):
            return False
        return hmac.compare_digest(presented.encode(), self.proxy_secret.encode())

    def resolve(self, peer: str, forwarded: list[str], from_proxy: bool = False) -> str:
        """The client address of a request from socket peer ``peer`` with these
        X-Forwarded-For values (each header line, in order); ``from_proxy``: the request
        carried the packaged proxy's secret (:meth:`secret_matches`)."""
        if not forwarded or not (from_proxy or self.trusted(peer)):
            return peer
        hops = [h.strip() for line in forwarded for h in line.split(",") if h.strip()]
        if not hops:
            return peer
        n = max(1, self.trusted_proxy_hops)
        entry = hops[-n] if len(hops) >= n else hops[0]
        addr = _ip(entry)
        # A proxy writes an address; anything else is not an address we can check.
        return str(addr) if addr is not None else peer


_CLIENT_ADDRESS: tuple[object, ClientAddress] | None = None


def client_address_settings(config=None) -> ClientAddress:
    """The :class:`ClientAddress` settings of ``config`` (the hub's), made once."""
    global _CLIENT_ADDRESS
    if _CLIENT_ADDRESS is None or _CLIENT_ADDRESS[0] is not config:
        _CLIENT_ADDRESS = (config, ClientAddress(config=config) if config is not None
                           else ClientAddress())
    return _CLIENT_ADDRESS[1]


def peer_address(request) -> str:
    """The socket peer of a tornado request (not what X-Real-Ip/X-Forwarded-For say)."""
    ctx = getattr(getattr(request, "connection", None), "context", None)
    raw = getattr(ctx, "_orig_remote_ip", None) or getattr(ctx, "remote_ip", None)
    if raw is None:
        address = getattr(ctx, "address", None)
        raw = address[0] if isinstance(address, tuple) and address else request.remote_ip
    addr = _ip(raw)
    return str(addr) if addr is not None else str(raw or "")


def from_proxy(request, settings: ClientAddress) -> bool:
    """Did the packaged proxy forward ``request``? Decided once per request: the header is
    checked, then removed, so that no handler, log or upstream ever sees the secret."""
    verdict = getattr(request, _VERDICT, None)
    if verdict is None:
        presented = request.headers.get(SECRET_HEADER)
        verdict = settings.secret_matches(peer_address(request), presented)
        if SECRET_HEADER in request.headers:
            del request.headers[SECRET_HEADER]
        setattr(request, _VERDICT, verdict)
    return verdict


def request_client_address(request, config=None) -> str:
    """:func:`client_address` of a tornado request (before any handler is made)."""
    settings = client_address_settings(config)
    return settings.resolve(peer_address(request), request.headers.get_list("X-Forwarded-For"),
                            from_proxy(request, settings))


def client_address(handler) -> str:
    """The address of the client that sent ``handler``'s request, as a string: the
    socket's peer, unless the request came through the packaged proxy (its secret) or
    from one of ``c.ClientAddress.trusted_proxies``, in which case the X-Forwarded-For
    entry the proxies appended (``c.ClientAddress.trusted_proxy_hops``). Used for
    ``allowed_client_ip`` on every way in and for login throttling."""
    return request_client_address(handler.request,
                                  getattr(handler, "settings", {}).get("config"))


def address_allowed(address: str | None, allowed) -> bool:
    """Is ``address`` inside one of ``allowed`` (addresses or CIDR networks; entries that
    are neither are skipped)? An empty ``allowed`` allows everything."""
    if not allowed:
        return True
    addr = _ip(address)
    if addr is None:
        return False
    for item in allowed:
        try:
            if addr in ipaddress.ip_network(str(item).strip(), strict=False):
                return True
        except (ValueError, TypeError):
            continue
    return False
