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
# A directory listing that an entry renamed or removed meanwhile does not fail
# (backendai_kernel_contents: JupyterLab said "Directory not found" for the home).
c.ServerApp.contents_manager_class = "backendai_kernel_contents.ListingContentsManager"  # noqa: F821
# No large request body from a client without access to this server (backendai_kernel_bodies).
c.ServerApp.jpserver_extensions.update({"backendai_kernel_bodies": True})  # noqa: F821
# JupyterLab's extension manager lists what is installed and installs nothing: the image's
# environment is root's (read-only to the user), and the server runs without the user's
# site (backendai-kernel-init), so an extension the default PyPI manager installed with
# pip (to ~/.local, pip's fallback) would never load. The PyPI manager also fetched its
# listings from pypi.org, and it made an HTTP client at every server start, loading the
# CA bundle into an SSL context: a third of a bound pooled server's start (profiled).
c.LabApp.extension_manager = "readonly"  # noqa: F821
# JupyterLab's news plugin ("Would you like to get notified about official Jupyter
# news?", then fetching the news and update checks from the internet) is off unless the
# hub's c.BackendAISpawner.jupyterlab_news passes BACKENDAI_JUPYTERLAB_NEWS=1.
if os.environ.get("BACKENDAI_JUPYTERLAB_NEWS", "0") != "1":
    c.LabApp.news_url = None  # noqa: F821
    # The plugin off in JupyterLab's page config: a labconfig/page_config.json on the
    # Jupyter config path, which JupyterLab reads for each page (a page_config_hook in
    # the server's settings does not last: jupyterhub-singleuser's extension puts its
    # own there, and the popup showed in every Docker session).
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        p for p in ("/opt/backendai/jupyter-config-no-news",
                    os.environ.get("JUPYTER_CONFIG_PATH", "")) if p)
