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

state = os.path.abspath(os.environ.get("BACKENDAI_STATE_DIR", "backendai-state"))
os.makedirs(state, exist_ok=True)
c.JupyterHub.db_url = "sqlite:///" + os.path.join(state, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(state, "jupyterhub_cookie_secret")
c.JupyterHub.bind_url = os.environ.get("BACKENDAI_HUB_URL", "http://127.0.0.1:8000/")
if os.environ.get("BACKENDAI_PROXY_API_URL"):
    c.ConfigurableHTTPProxy.api_url = os.environ["BACKENDAI_PROXY_API_URL"]
c.ConfigurableHTTPProxy.pid_file = os.path.join(state, "jupyterhub-proxy.pid")
if os.environ.get("BACKENDAI_CHP"):
    c.ConfigurableHTTPProxy.command = [os.environ["BACKENDAI_CHP"]]
c.JupyterHub.hub_port = int(os.environ.get("BACKENDAI_HUB_API_PORT", "8081"))
# Containers on the agent's bridge network reach the hub API through the
# network's gateway, so the hub API listens beyond loopback; the agent rewrites
# the loopback API URL it hands to kernels.
c.JupyterHub.hub_ip = os.environ.get("BACKENDAI_HUB_API_IP", "0.0.0.0")
c.JupyterHub.hub_connect_ip = "127.0.0.1"

c.BackendAIManager.db_url = os.environ.get(
    "BACKENDAI_DB_URL", "sqlite:///" + os.path.join(state, "backendai.sqlite")
)
c.Agent.state_dir = os.path.join(state, "agent")
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
