# System-wide Jupyter server config of the kernel image (/opt/venv/etc/jupyter): the
# image's service ports (ai.backend.service-ports, passed in by the agent as
# BACKENDAI_SERVICE_PORTS) become jupyter-server-proxy entries with launcher tiles.
# See /opt/backendai/backendai_kernel_services.py.
import os
import sys

# The server started without the user's site (backendai-kernel-init: its configuration
# and extensions are the image's); the kernels and terminals it starts get it back.
os.environ.pop("PYTHONNOUSERSITE", None)

sys.path.insert(0, "/opt/backendai")
import backendai_kernel_services  # noqa: E402

backendai_kernel_services.configure(c)  # noqa: F821
# No large request body from a client without access to this server (backendai_kernel_bodies).
c.ServerApp.jpserver_extensions.update({"backendai_kernel_bodies": True})  # noqa: F821
