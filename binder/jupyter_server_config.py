# Jupyter Server configuration of the Binder demo; postBuild copies it to
# ~/.jupyter/jupyter_server_config.py.
#
# It registers a jupyter-server-proxy entry, shown as the "Backend.AI Hub" tile
# in the JupyterLab launcher. Opening <base_url>backendai-hub/ (the tile, or the
# Binder link's ?urlpath=backendai-hub/) starts `backendai-hub` on the port that
# jupyter-server-proxy picked, with the hub's base URL set to that same public
# path: absolute_url=True forwards paths unchanged, so the hub's redirects and
# links, and the sessions' JupyterLab under <base_url>backendai-hub/user/..., all
# work behind the proxy.
import json
import os
import shutil
import socket
import sys

DEMO_DIR = os.environ.get("BACKENDAI_DEMO_DIR") or os.path.expanduser("~/.backendai-demo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _literal(value: str) -> str:
    # jupyter-server-proxy formats what these callables return with {port} and
    # {base_url}, so literal braces are doubled.
    return value.replace("{", "{{").replace("}", "}}")


def _hub_command():
    exe = shutil.which("backendai-hub", path=os.path.dirname(sys.executable)) or "backendai-hub"
    return [_literal(exe), "-f", _literal(os.path.join(DEMO_DIR, "jupyterhub_config.py"))]


def _hub_environment():
    # Called at each start of the hub. {port} is the port that jupyter-server-proxy
    # picked and forwards to; {base_url} is the Jupyter server's ("/user/<name>/"
    # on Binder), so the hub's base URL is the public path of this entry.
    env = {
        "BACKENDAI_STATE_DIR": os.path.join(DEMO_DIR, "state"),
        "BACKENDAI_HUB_API_IP": "127.0.0.1",
        "BACKENDAI_HUB_API_PORT": str(_free_port()),
        "BACKENDAI_PROXY_API_PORT": str(_free_port()),
        "BACKENDAI_CHP": os.path.join(
            DEMO_DIR, "node", "node_modules", ".bin", "configurable-http-proxy"
        ),
        "BACKENDAI_AGENT_BACKEND": "local",
        "BACKENDAI_AGENT_ID": "i-binder",
        "BACKENDAI_AGENT_SLOTS": json.dumps({"cpu": 2, "mem": "1g"}),
        "BACKENDAI_START_TIMEOUT": "120",
        "BACKENDAI_ADMIN_EMAIL": "admin@demo.example",
    }
    env = {k: _literal(v) for k, v in env.items()}
    env["BACKENDAI_HUB_URL"] = "http://127.0.0.1:{port}{base_url}backendai-hub/"
    return env


c = get_config()  # noqa: F821

c.ServerProxy.servers = {
    "backendai-hub": {
        "command": _hub_command,
        "environment": _hub_environment,
        "absolute_url": True,
        # First start: migrations are already done by postBuild; the hub and its
        # proxy come up in a few seconds, but Binder machines can be slow.
        "timeout": 120,
        "new_browser_tab": True,
        "launcher_entry": {
            "title": "Backend.AI Hub",
            "icon_path": os.path.join(DEMO_DIR, "backendai-hub.svg"),
        },
    }
}
