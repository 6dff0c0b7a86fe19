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


# Settings of the demo hub that the packaged configuration takes no environment
# variable for; `backendai-hub` hands extra arguments to jupyterhub, and the
# command line wins over the configuration file. Sizes: the agent has room for
# four default sessions ({"cpu": 2, "mem": "1g"}, 0.5 CPU and 256m each), so
# that what stops a demo user's third session is not the agent but the user's
# quota: the "demo" keypair resource policy (binder/demo-fixture.json) allows
# 1 CPU in all, and the third session waits PENDING with "quota exceeded".
#
# The storage volume of the hub's embedded storage proxy, where vfolders live (the
# demo project's "shared" folder, made by postBuild's `fixture populate`): inside
# the demo's folder in the user's home, not in the repository's working tree.
VOLUME_PATH = os.path.join(DEMO_DIR, "vfroot", "volume1")
HUB_ARGS = [
    '--BackendAISpawner.images=["local/python"]',
    "--BackendAISpawner.default_cpu=0.5",
    "--BackendAISpawner.default_mem=256m",
    "--BackendAIManager.storage_volumes="
    + json.dumps({"volume1": {"backend": "vfs", "path": VOLUME_PATH}}),
]


def _hub_command():
    exe = shutil.which("backendai-hub", path=os.path.dirname(sys.executable)) or "backendai-hub"
    # The proxy's REST API defaults to 127.0.0.1:8001: take a free port instead.
    api = f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{_free_port()}"
    return [_literal(a) for a in [exe, *HUB_ARGS, api]]


def _hub_environment():
    # Called at each start of the hub. {port} is the port that jupyter-server-proxy
    # picked and forwards to; {base_url} is the Jupyter server's ("/user/<name>/"
    # on Binder), so the hub's base URL is the public path of this entry.
    env = {
        "BACKENDAI_STATE_DIR": os.path.join(DEMO_DIR, "state"),
        "BACKENDAI_HUB_API_IP": "127.0.0.1",
        "BACKENDAI_HUB_API_PORT": str(_free_port()),
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


_STARTING_PAGE = b"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="1">
<title>Starting Backend.AI Hub</title></head>
<body><p>Starting Backend.AI Hub&hellip; this page reloads by itself.</p></body></html>
"""


def _while_starting(response, request):
    # jupyter-server-proxy takes the hub as ready at the first HTTP answer on
    # {port}. That comes from the hub's configurable-http-proxy a moment before
    # the hub has added its routes, and is a bare 404 (the hub's own pages always
    # have a Content-Type). Turn that one into a page that reloads itself.
    if (
        response.code == 404
        and request.method == "GET"
        and not response.headers.get("Content-Type")
    ):
        response.code = 503
        response.headers["Content-Type"] = "text/html; charset=utf-8"
        response.headers["Cache-Control"] = "no-store"
        response.headers["Retry-After"] = "1"
        response.body = _STARTING_PAGE


c = get_config()  # noqa: F821

c.ServerProxy.servers = {
    "backendai-hub": {
        "command": _hub_command,
        "environment": _hub_environment,
        "absolute_url": True,
        "rewrite_response": _while_starting,
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
