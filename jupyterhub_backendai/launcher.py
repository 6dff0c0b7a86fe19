"""``backendai-hub``: set up and start the platform on its embedded default in one command.

It makes the state directory private (0700; its databases 0600), migrates the
record, creates the first superadmin (from BACKENDAI_ADMIN_EMAIL and
BACKENDAI_ADMIN_PASSWORD, or with a generated password), shows the new
superadmin's keys once (on the terminal, or in a 0600 file when the output is not
a terminal, so that they never land in a log), installs configurable-http-proxy
from npm when it is missing, prints the login URL and runs JupyterHub with the
packaged configuration. Extra arguments go to jupyterhub.

The URL helpers and :func:`secure_state_dir` are shared with the packaged
``share/jupyterhub_config.py``, so ``jupyterhub -f`` gets the same URLs and modes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
from urllib.parse import urlparse, urlunparse

CHP_VERSION = "5.3.0"
# The hub's public URL on the embedded default. A host *name* (not an IP address)
# gives every user's servers their own origin on a subdomain
# (http://<user>.localhost:8000/user/<user>/; browsers resolve *.localhost to loopback).
DEFAULT_HUB_URL = "http://localhost:8000/"
DEFAULT_STATE_DIR = "backendai-state"
# Written instead of printing when the output is not a terminal (docs/security.md).
FIRST_ADMIN_FILE = "first-superadmin.json"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def hub_url() -> str:
    """BACKENDAI_HUB_URL: the URL the proxy listens on and users open."""
    return os.environ.get("BACKENDAI_HUB_URL") or DEFAULT_HUB_URL


def subdomain_host(url: str | None = None) -> str:
    """``JupyterHub.subdomain_host`` for the packaged config.

    BACKENDAI_SUBDOMAIN_HOST wins when set (an empty value turns subdomains off);
    otherwise ``scheme://host[:port]`` of the hub URL when its host is a name, and
    off ("") when it is an IP address, where no subdomain can exist.
    """
    if "BACKENDAI_SUBDOMAIN_HOST" in os.environ:
        return os.environ["BACKENDAI_SUBDOMAIN_HOST"].strip().rstrip("/")
    u = urlparse(url or hub_url())
    host = u.hostname or ""
    if not host or _is_ip(host):
        return ""
    return f"{u.scheme}://{u.netloc}"


def bind_url(url: str | None = None) -> str:
    """The proxy's bind URL: the hub URL, with ``localhost`` bound as 127.0.0.1 (a bare
    name could make the proxy listen on ::1 only, depending on the resolver's order)."""
    url = url or hub_url()
    u = urlparse(url)
    if u.hostname == "localhost":
        netloc = "127.0.0.1" + (f":{u.port}" if u.port else "")
        return urlunparse(u._replace(netloc=netloc))
    return url


def login_url(url: str | None = None) -> str:
    """Where people log in: the subdomain host (with the hub URL's path) when in use."""
    url = url or hub_url()
    sub = subdomain_host(url)
    if sub:
        u = urlparse(url)
        url = sub + (u.path or "/")
    return url.rstrip("/") + "/hub/login"


def _private_file(path: str) -> None:
    """Create ``path`` (empty) with mode 0600 if missing, else make it 0600."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def secure_state_dir(state: str, db_urls: tuple[str, ...] | list[str] = ()) -> str:
    """Make the state directory private: the directory 0700, the SQLite databases in
    ``db_urls`` (created empty when missing, so they are never world-readable, not
    even for a moment; an empty file is a new database to SQLite and alembic) and
    JupyterHub's cookie secret 0600. SQLite gives its journal files the database
    file's mode. Returns the absolute path."""
    state = os.path.abspath(state)
    os.makedirs(state, mode=0o700, exist_ok=True)
    st = os.stat(state)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(state, 0o700)
    from .manager.cliviews import sqlite_path

    for url in db_urls:
        path = sqlite_path(url)
        if path and os.path.isdir(os.path.dirname(path)):
            _private_file(path)
    secret = os.path.join(state, "jupyterhub_cookie_secret")
    if os.path.exists(secret):
        _private_file(secret)
    return state


def find_or_install_chp(state: str) -> str:
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    local = os.path.join(state, "node", "node_modules", ".bin", "configurable-http-proxy")
    if not os.path.exists(local):
        if not shutil.which("npm"):
            raise SystemExit("backendai-hub: configurable-http-proxy is missing and npm is not installed")
        print(f"installing configurable-http-proxy {CHP_VERSION} with npm ...", flush=True)
        subprocess.run(
            ["npm", "install", "--silent", "--prefix", os.path.join(state, "node"),
             f"configurable-http-proxy@{CHP_VERSION}"],
            check=True,
        )
    return local


def chp_command(chp: str) -> list[str]:
    """The command that runs configurable-http-proxy ``chp``: through
    ``share/chp-guard.js`` (a request target that does not parse or decode gets 400
    instead of CHP's 500) when node is on PATH and ``chp`` is an npm-installed CHP (its
    ``lib/configproxy.js`` beside its ``bin/``); else ``chp`` itself."""
    real = os.path.realpath(shutil.which(chp) or chp)  # a bare command name: found on PATH
    node = shutil.which("node")
    lib = os.path.join(os.path.dirname(os.path.dirname(real)), "lib", "configproxy.js")
    if node and os.path.isfile(lib):
        return [node, os.path.join(os.path.dirname(__file__), "share", "chp-guard.js"), real]
    return [chp]


def show_first_superadmin(state: str, out: dict, url: str) -> None:
    """Show the new superadmin's credentials once: on the terminal when stdout is one;
    otherwise (output going to a file or a log collector) in a 0600 file in the state
    directory, so that the secret key and a generated password never reach a log."""
    change = (f"change the password after logging in, at {url.rstrip('/')}/hub/backendai/password"
              " (or with `backendai-admin reset-password`)")
    if sys.stdout.isatty():
        print("first superadmin created (shown once, not logged):")
        print(json.dumps(out, indent=2))
        if "password" in out:
            print(f"(the password is generated: {change})")
        return
    path = os.path.join(state, FIRST_ADMIN_FILE)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"first superadmin {out.get('email')} created; the output is not a terminal, so its "
          f"keys{' and generated password' if 'password' in out else ''} are in {path} "
          "(mode 0600): read it, then delete it")
    if "password" in out:
        print(f"({change})")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from .cli import create_superadmin

    state = os.path.abspath(os.environ.setdefault("BACKENDAI_STATE_DIR", DEFAULT_STATE_DIR))
    # One hub per state directory: refused here, before the record is touched (the
    # lock is close-on-exec; the packaged config takes it again for the hub's life),
    # and the installation's identity made before anything else marks the directory
    # as used (common/installation.py).
    from .common import installation

    try:
        installation.hold_state(state)
        installation.ensure(state)
    except installation.InstallationError as e:
        raise SystemExit(f"backendai-hub: {e}") from None
    db = os.environ.setdefault(
        "BACKENDAI_DB_URL", "sqlite:///" + os.path.join(state, "backendai.sqlite")
    )
    secure_state_dir(state, (db, "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")))
    if not os.environ.get("BACKENDAI_CHP"):
        os.environ["BACKENDAI_CHP"] = find_or_install_chp(state)
    email = os.environ.get("BACKENDAI_ADMIN_EMAIL", "admin@example.com")
    url = hub_url()
    login = login_url(url)
    out = create_superadmin(db, email, os.environ.get("BACKENDAI_ADMIN_PASSWORD"))
    if out.get("created"):
        show_first_superadmin(state, out, login[: -len("/hub/login")])
    print(f"jupyterhub-backendai: log in at {login} as {email}", flush=True)
    config = os.path.join(os.path.dirname(__file__), "share", "jupyterhub_config.py")
    installation.release_state(state)
    run_hub(["-f", config, *argv])


def run_hub(argv: list[str]) -> None:
    """JupyterHub's ``main`` in this process, as ``python -m jupyterhub_backendai.hubmain``
    runs it. Not a new interpreter: what the record's setup above imported (the manager,
    SQLAlchemy, pydantic, alembic) serves the hub as it is, instead of being imported
    again, which was about half of the CPU a hub start took (benchmarks/hubstart.py). The
    setup leaves nothing behind for the hub: its engine is disposed, the state lock
    released (the packaged config takes it again)."""
    from . import hubmain  # (its guard against the optional iri checker comes first)

    sys.argv = [sys.argv[0], *argv]
    hubmain.main()


if __name__ == "__main__":
    main()
