# The embedded default of jupyterhub-backendai: SQLite, in-process event bus,
# one in-process agent (Docker when an engine answers, local processes otherwise).
# Settings come from the environment so that one file serves the launcher,
# the tests and Binder; override anything below in your own config.
import os

c = get_config()  # noqa: F821

c.JupyterHub.authenticator_class = "backendai"
c.JupyterHub.spawner_class = "backendai"
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 0
# Sessions outlive the hub: a restarted hub finds them again.
c.JupyterHub.cleanup_servers = False

from jupyterhub_backendai import launcher as _launcher  # noqa: E402

# BACKENDAI_STATE_DIR: databases, cookie secret, agent state and vfolders; made 0700
# below, its SQLite databases and the cookie secret 0600.
state = os.path.abspath(os.environ.get("BACKENDAI_STATE_DIR", _launcher.DEFAULT_STATE_DIR))
os.makedirs(state, mode=0o700, exist_ok=True)
# One hub per state directory (a lock held for the hub's life, hub.lock), and the
# installation's identity (installation-id, 0600, made once): the embedded agent's
# default id is unique to it and it touches no other installation's containers
# (jupyterhub_backendai/common/installation.py, docs/security.md).
from jupyterhub_backendai.common import installation as _installation  # noqa: E402

try:
    _installation.hold_state(state)
    _installation.ensure(state)
except _installation.InstallationError as _e:
    raise SystemExit(f"jupyterhub-backendai: {_e}") from None
c.JupyterHub.db_url = "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")
# JupyterHub's SQLite database as the platform's own: WAL, synchronous=NORMAL (no fsync
# at each commit; JupyterHub commits on its event loop). A config of your own that keeps
# JupyterHub on SQLite can call this too; PostgreSQL or MySQL URLs are not touched.
from jupyterhub_backendai.models.db import sqlite_wal_everywhere as _sqlite_wal  # noqa: E402

_sqlite_wal()
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
# BACKENDAI_HUB_URL (default http://localhost:8000/): where the proxy listens and
# users log in. When its host is a name, every user's servers get their own origin
# on a subdomain, http://<user>.<host>/user/<user>/ (JupyterHub.subdomain_host; the
# proxy routes by host, cookies and OAuth follow). BACKENDAI_SUBDOMAIN_HOST sets
# that host explicitly (e.g. https://hub.example.org with a wildcard DNS name and
# certificate) or, empty, turns subdomains off. With an IP address there are no
# subdomains: servers share the hub's origin, and the hub warns at start.
c.JupyterHub.bind_url = _launcher.bind_url()
c.JupyterHub.subdomain_host = _launcher.subdomain_host()
if not c.JupyterHub.subdomain_host:
    from traitlets.log import get_logger as _get_logger

    _get_logger().warning(
        "No subdomains (JupyterHub.subdomain_host is empty, hub URL %s): every user's "
        "server shares the hub's origin, so a page served from one user's server can act "
        "as anyone who opens it. Give the hub a host name (BACKENDAI_HUB_URL=http://"
        "localhost:8000/, or BACKENDAI_SUBDOMAIN_HOST) for an origin per user; see "
        "docs/security.md.", _launcher.hub_url()
    )
# BACKENDAI_SSL_CERT and BACKENDAI_SSL_KEY (PEM files): the proxy serves HTTPS itself
# (give an https:// BACKENDAI_HUB_URL); or a front proxy terminates TLS. Over HTTPS the
# hub's cookies are __Host- cookies, which a browser takes only from the hub's own host:
# no user's host can plant one beside them (cookie tossing; docs/security.md).
if os.environ.get("BACKENDAI_SSL_CERT") or os.environ.get("BACKENDAI_SSL_KEY"):
    c.JupyterHub.ssl_cert = os.environ["BACKENDAI_SSL_CERT"]
    c.JupyterHub.ssl_key = os.environ["BACKENDAI_SSL_KEY"]
c.JupyterHub.cookie_host_prefix_enabled = _launcher.hub_url().startswith("https://")
if os.environ.get("BACKENDAI_PROXY_API_URL"):
    c.ConfigurableHTTPProxy.api_url = os.environ["BACKENDAI_PROXY_API_URL"]
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")
if os.environ.get("BACKENDAI_CHP"):
    # Through share/chp-guard.js: a target that does not parse or decode gets 400, not 500;
    # requests for the hub carry the proxy's secret; users' servers refuse addresses
    # outside their allowed_client_ip.
    c.ConfigurableHTTPProxy.command = _launcher.chp_command(os.environ["BACKENDAI_CHP"])
# The client-address rule (docs/security.md, jupyterhub_backendai/common/clientaddr.py):
# the hub believes X-Forwarded-For only from the proxy it started, told apart from every
# other process on this host by a secret made afresh at each start and handed to the
# proxy only (CHP inherits the environment; kernels of the local backend get a fixed
# short list of variables, never this one).
import secrets as _secrets  # noqa: E402

_proxy_secret = _secrets.token_urlsafe(32)
os.environ["BACKENDAI_PROXY_SECRET"] = _proxy_secret
c.ClientAddress.proxy_secret = _proxy_secret
c.JupyterHub.proxy_class = "jupyterhub_backendai.proxy.BackendAIProxy"
if not any(str(part).endswith("chp-guard.js") for part in c.ConfigurableHTTPProxy.get("command", [])):
    from traitlets.log import get_logger as _get_logger

    _get_logger().warning(
        "configurable-http-proxy runs without share/chp-guard.js (BACKENDAI_CHP unset, no "
        "node on PATH, or not an npm-installed CHP): the hub believes no X-Forwarded-For "
        "(every client has the proxy's address) and users' servers do not check "
        "allowed_client_ip; see docs/security.md.")
# BACKENDAI_APP_FRONT=nginx: nginx in front of the proxy, with a fast path straight to
# the apps sessions serve on ports (jupyterhub_backendai/appfront.py, docs/service-ports.md).
# nginx appends one X-Forwarded-For entry before the proxy's: two trusted hops (and the
# proxy takes the client's address for users' servers from nginx's entry).
if os.environ.get("BACKENDAI_APP_FRONT", "") == "nginx":
    c.JupyterHub.proxy_class = "jupyterhub_backendai.appfront.AppFrontProxy"
    c.ClientAddress.trusted_proxy_hops = 2
    os.environ["BACKENDAI_PROXY_FRONT_HOPS"] = "1"
elif os.environ.get("BACKENDAI_APP_FRONT", ""):
    raise ValueError("BACKENDAI_APP_FRONT: only 'nginx' (or empty, no front) is known")
c.JupyterHub.hub_port = int(os.environ.get("BACKENDAI_HUB_API_PORT", "8081"))
# The hub API listens on loopback; with the Docker backend the embedded agent adds
# its network's gateway, where kernels (each session on a network of its own) reach
# it (c.Agent.hub_api_on_gateway), and rewrites the loopback API URL it hands to
# kernels. Nowhere else: set BACKENDAI_HUB_API_IP only for agents on other nodes.
c.JupyterHub.hub_ip = os.environ.get("BACKENDAI_HUB_API_IP", "127.0.0.1")
c.JupyterHub.hub_connect_ip = "127.0.0.1"

c.BackendAIManager.db_url = os.environ.get(
    "BACKENDAI_DB_URL", "sqlite:///" + os.path.join(state, "backendai.sqlite")
)
_launcher.secure_state_dir(state, (c.BackendAIManager.db_url, c.JupyterHub.db_url))
c.Agent.state_dir = os.path.join(state, "agent")
c.Agent.installation_dir = state
# Vfolders of the in-hub storage proxy "local" (docs/storage.md).
c.BackendAIManager.storage_volumes = {
    "volume1": {"backend": "vfs", "path": os.path.join(state, "vfroot", "volume1")}
}
c.Agent.backend = os.environ.get("BACKENDAI_AGENT_BACKEND", "auto")
if os.environ.get("BACKENDAI_AGENT_ID"):
    c.Agent.agent_id = os.environ["BACKENDAI_AGENT_ID"]
if os.environ.get("BACKENDAI_AGENT_SLOTS"):
    import json

    c.Agent.slots = json.loads(os.environ["BACKENDAI_AGENT_SLOTS"])
if os.environ.get("BACKENDAI_AGENT_PORT_RANGE"):
    lo, hi = os.environ["BACKENDAI_AGENT_PORT_RANGE"].split("-")
    c.Agent.port_range = (int(lo), int(hi))
c.Spawner.start_timeout = int(os.environ.get("BACKENDAI_START_TIMEOUT", "300"))
c.Spawner.http_timeout = 120
c.Spawner.default_url = "/lab"

# The admin REST API (/hub/api/backendai/, docs/api.md) requires these scopes of a
# JupyterHub token. They are granted to the `user` role, which every user holds,
# admins included (JupyterHub forbids changing the `admin` role's scopes), so
# default tokens work and a token issued with narrower scopes is refused.
c.JupyterHub.custom_scopes = {
    "custom:backendai:read": {"description": "Read the Backend.AI admin API."},
    "custom:backendai:write": {"description": "Change things through the Backend.AI admin API."},
}
c.JupyterHub.extra_user_scopes = ["custom:backendai:read", "custom:backendai:write"]
