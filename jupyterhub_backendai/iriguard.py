"""Keeps jsonschema's optional checker for the ``iri`` and ``iri-reference`` formats (the
``rfc3987_syntax`` package, pulled in through ``jupyter_events`` ->
``jsonschema[format-nongpl]``) from loading in this process: imported first by the
entry points into JupyterHub, ``hubmain`` (the hub) and ``singleusermain`` (the local
backend's Jupyter servers), before anything imports jsonschema.

The package compiles its Earley grammars when imported (python-jsonschema/jsonschema#1428):
on this project's machines 2.2 s of a 4.7 s ``jupyterhub --version`` and 1.6-2.1 s of
CPU at every ``jupyterhub-singleuser`` start (benchmarks/hubstart.py). No schema the hub
or the server validates uses those formats (JupyterHub's and jupyter_events' event
schemas, our API's request models), and jsonschema treats the package as optional:
without it those two formats go unchecked, as when it is not installed. The kernel image
leaves it out altogether (images/kernel/requirements.in).
"""

import sys

# An entry of None makes ``import rfc3987_syntax`` raise ImportError, which jsonschema's
# format module expects of an optional checker.
sys.modules.setdefault("rfc3987_syntax", None)
