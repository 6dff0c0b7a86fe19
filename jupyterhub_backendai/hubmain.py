"""``python -m jupyterhub_backendai.hubmain``: JupyterHub's own ``main``, as the launcher
(``backendai-hub``) starts it.

One thing differs from ``python -m jupyterhub``: jsonschema's optional checker for the
``iri`` and ``iri-reference`` formats (the ``rfc3987_syntax`` package, pulled in through
``jupyter_events`` -> ``jsonschema[format-nongpl]``) is kept from loading. It compiles its
Earley grammars when imported: about 0.7 s of a 5.1 s hub start here, 2.2 s of a 4.7 s
``jupyterhub --version`` (benchmarks/hubstart.py; python-jsonschema/jsonschema#1428). No schema the hub validates uses those formats
(JupyterHub's and jupyter_events' event schemas, our API's request models), and
jsonschema treats the package as optional: without it those two formats go unchecked,
as when it is not installed.
"""

import sys

# An entry of None makes ``import rfc3987_syntax`` raise ImportError, which jsonschema's
# format module expects of an optional checker.
sys.modules.setdefault("rfc3987_syntax", None)

from jupyterhub.app import main  # noqa: E402 (after the entry above, on purpose)

if __name__ == "__main__":
    main()
