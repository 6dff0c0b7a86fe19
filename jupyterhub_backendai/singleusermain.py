"""``backendai-singleuser``: JupyterHub's ``jupyterhub-singleuser``, as the local backend
starts it for a session's Jupyter server (agent/backends/local.py).

One thing differs, as in :mod:`.hubmain` for the hub: jsonschema's optional checker for
the ``iri`` and ``iri-reference`` formats (the ``rfc3987_syntax`` package, pulled in
through ``jupyter_server`` -> ``jupyter_events`` -> ``jsonschema[format-nongpl]``) is
kept from loading. It compiles its Earley grammars when imported: 1.6-2.1 s of CPU at
every server start on this project's machines, more than half of the server's imports
(benchmarks/hubstart.py: ``--version`` in 3.22 s against 1.40 s). No schema the server validates uses those formats
(jupyter_events' event schemas), and jsonschema treats the package as optional.

Only the server's process is concerned: the session's kernels (ipykernel) and terminals
are processes of their own, where ``import rfc3987_syntax`` works as installed. The
kernel image leaves the package out altogether (images/kernel/requirements.in).
"""

import sys

# An entry of None makes ``import rfc3987_syntax`` raise ImportError, which jsonschema's
# format module expects of an optional checker.
sys.modules.setdefault("rfc3987_syntax", None)

from jupyterhub.singleuser import main  # noqa: E402 (after the entry above, on purpose)

if __name__ == "__main__":
    main()
