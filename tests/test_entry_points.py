"""The platform's entry points into JupyterHub keep jsonschema's optional ``iri`` format
checker (``rfc3987_syntax``, a second or more of grammar compilation at import) out of
the process: ``hubmain`` for the hub, ``backendai-singleuser`` for the local backend's
Jupyter servers. Each check runs in a fresh interpreter of this environment, where the
package is installed as the README's install leaves it (through jupyter-events)."""

from __future__ import annotations

import os
import subprocess
import sys

from jupyterhub_backendai.agent.backends.local import LocalBackend

from .services import agent_id as new_agent_id

# What a process has loaded once the server's (or the hub's) imports are done: whether
# rfc3987_syntax is a module there, and whether jsonschema checks the "iri" format.
PROBE = """
import sys
{setup}
import jsonschema
import jupyter_server.serverapp  # jupyter_events -> jsonschema's format checkers
mod = sys.modules.get("rfc3987_syntax")
print(type(mod).__name__, "iri" in jsonschema.FormatChecker.checkers)
"""


def _probe(setup: str) -> tuple[str, bool]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], check=True,
                         capture_output=True, text=True, timeout=120).stdout.split()
    return out[0], out[1] == "True"


def test_the_environment_has_the_checker_the_entry_points_leave_out():
    # Without this the other tests would prove nothing: a plain import loads it.
    assert _probe("") == ("module", True)


def test_hubmain_keeps_the_iri_checker_out():
    assert _probe("sys.argv = ['x']\nimport jupyterhub_backendai.hubmain") == ("NoneType", False)


def test_backendai_singleuser_keeps_the_iri_checker_out():
    assert _probe("import jupyterhub_backendai.singleusermain") == ("NoneType", False)


def test_the_local_backend_starts_servers_with_backendai_singleuser(tmp_path):
    backend = LocalBackend(agent_id=new_agent_id("test-entry"), state_dir=str(tmp_path),
                           work_root=str(tmp_path / "work"))
    exe = backend.cmd[0]
    assert os.path.basename(exe) == "backendai-singleuser"
    assert os.path.dirname(exe) == os.path.dirname(sys.executable)
    # It is JupyterHub's server, only imported the platform's way.
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    import jupyterhub
    assert r.stdout.strip() == jupyterhub.__version__
