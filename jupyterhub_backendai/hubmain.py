"""``python -m jupyterhub_backendai.hubmain``: JupyterHub's own ``main``, as the launcher
(``backendai-hub``) starts it.

One thing differs from ``python -m jupyterhub``: jsonschema's optional checker for the
``iri`` formats is kept from loading (:mod:`.iriguard` says why); it was about 0.7 s of a
5.1 s hub start here.
"""

from . import iriguard  # noqa: F401, I001 (first, on purpose)
from jupyterhub.app import main  # (after the guard, on purpose)

if __name__ == "__main__":
    main()
