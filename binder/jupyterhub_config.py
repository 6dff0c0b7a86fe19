# JupyterHub configuration of the Binder demo: the packaged embedded default
# (jupyterhub_backendai/share/jupyterhub_config.py, all settings from BACKENDAI_*
# environment variables) plus what only the demo needs. The "Backend.AI Hub"
# launcher tile (binder/jupyter_server_config.py) starts
# `backendai-hub -f <this file>`; the last -f wins, so this file loads the
# packaged one first.
import os

import jupyterhub_backendai

c = get_config()  # noqa: F821

load_subconfig(  # noqa: F821
    os.path.join(os.path.dirname(jupyterhub_backendai.__file__), "share", "jupyterhub_config.py")
)

# The local-process backend offers one image; sessions are sized so that two fit
# in the agent's slots ({"cpu": 2, "mem": "1g"}) and a third waits PENDING.
c.BackendAISpawner.images = ["local/python"]
c.BackendAISpawner.default_cpu = os.environ.get("BACKENDAI_DEMO_SESSION_CPU", "0.5")
c.BackendAISpawner.default_mem = os.environ.get("BACKENDAI_DEMO_SESSION_MEM", "384m")
c.BackendAISpawner.default_gpu = 0
# The configurable-http-proxy REST API defaults to 127.0.0.1:8001; the tile picks
# a free port so that nothing else in the container can collide with it.
if os.environ.get("BACKENDAI_PROXY_API_PORT"):
    c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:" + os.environ["BACKENDAI_PROXY_API_PORT"]
