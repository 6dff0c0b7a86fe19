# Start the platform on its embedded default: `jupyterhub -f jupyterhub_config.py`
# (or `backendai-hub`, which also bootstraps the first superadmin).
# The settings live in the package so that installed copies use the same file.
import os

import jupyterhub_backendai

load_subconfig(  # noqa: F821
    os.path.join(os.path.dirname(jupyterhub_backendai.__file__), "share", "jupyterhub_config.py")
)
