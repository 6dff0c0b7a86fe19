"""``backendai-singleuser``: JupyterHub's ``jupyterhub-singleuser``, as the local backend
starts it for a session's Jupyter server (agent/backends/local.py).

One thing differs, as in :mod:`.hubmain` for the hub: jsonschema's optional checker for
the ``iri`` formats is kept from loading (:mod:`.iriguard` says why): ``--version`` in
1.40 s against 3.22 s (benchmarks/hubstart.py). Only the server's process is concerned:
the session's kernels (ipykernel) and terminals are processes of their own, where
``import rfc3987_syntax`` works as installed.
"""

from . import iriguard  # noqa: F401, I001 (first, on purpose)
from jupyterhub.singleuser import main  # (after the guard, on purpose)

if __name__ == "__main__":
    main()
