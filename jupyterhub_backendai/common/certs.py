"""The cluster CA and node certificates for mutual TLS between hub, agents and
storage proxies (docs/cluster.md).

    python -m jupyterhub_backendai.common.certs DIR [--node NAME[=HOST,...]] ...

makes, under DIR, a CA ``cluster-ca/cluster-ca.crt`` (its key beside it: keep it
offline) and one key pair per node, ``<name>/<name>.crt`` and ``<name>/<name>.key``
(mode 0600), signed by that CA, with the node's name as common name and its host
names/addresses as subject alternative names (``localhost`` and ``127.0.0.1`` when
none are given). A node ``hub`` is always made: it is the client the daemons accept
by default. Running it again adds the nodes that are missing and keeps the rest
(the CA included), so a new agent gets its certificate without re-issuing the others.

It uses ``certipy``, which JupyterHub itself uses for ``internal_ssl``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import sys

CA_NAME = "cluster-ca"
HUB_NAME = "hub"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def node_files(directory: str, name: str) -> dict[str, str]:
    """``{"ca", "cert", "key"}`` paths of node ``name`` under ``directory``."""
    return {
        "ca": os.path.join(directory, CA_NAME, f"{CA_NAME}.crt"),
        "cert": os.path.join(directory, name, f"{name}.crt"),
        "key": os.path.join(directory, name, f"{name}.key"),
    }


def _alt_names(hosts: list[str]) -> list[str]:
    out = []
    for h in hosts or ["localhost", "127.0.0.1"]:
        try:
            ipaddress.ip_address(h)
            out.append(f"IP:{h}")
        except ValueError:
            out.append(f"DNS:{h}")
    return out


def make_certs(directory: str, nodes: dict[str, list[str]]) -> dict[str, dict[str, str]]:
    """Make the CA (once) and a key pair for each of ``nodes`` (name -> host names)
    that does not have one yet, plus ``hub``. Returns every node's files."""
    from certipy import Certipy

    nodes = {HUB_NAME: [], **nodes}
    for name in nodes:
        if not _NAME.match(name) or name == CA_NAME:
            raise ValueError(
                f"a node name is letters, digits, '.', '_' and '-' (at most 63), not {name!r}"
            )
    os.makedirs(directory, mode=0o700, exist_ok=True)
    store = Certipy(store_dir=directory)
    if not os.path.exists(node_files(directory, CA_NAME)["ca"]):
        store.create_ca(CA_NAME, years=10, serial=secrets.randbits(63))
    out = {}
    for name, hosts in nodes.items():
        files = node_files(directory, name)
        if not os.path.exists(files["cert"]):
            store.create_signed_pair(
                name, CA_NAME, alt_names=_alt_names(hosts), years=5, serial=secrets.randbits(63)
            )
            os.chmod(files["key"], 0o600)
        out[name] = files
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m jupyterhub_backendai.common.certs",
        description="Make the cluster CA and node certificates for mutual TLS between "
        "the hub, agents and storage proxies.",
    )
    p.add_argument("directory", help="where the CA and the nodes' key pairs go")
    p.add_argument(
        "--node", action="append", default=[], metavar="NAME[=HOST,...]",
        help="a node (agent or storage proxy) and the host names/addresses it is reached "
        "at (default localhost,127.0.0.1); repeat for each node. 'hub' is always made.",
    )
    args = p.parse_args(argv)
    nodes: dict[str, list[str]] = {}
    for spec in args.node:
        name, _, hosts = spec.partition("=")
        nodes[name] = [h for h in hosts.split(",") if h]
    try:
        made = make_certs(args.directory, nodes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, files in made.items():
        print(f"{name}: {files['cert']} {files['key']}")
    print(f"CA: {node_files(args.directory, CA_NAME)['ca']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
