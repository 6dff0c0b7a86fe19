"""``backendai-hub``: set up and start the platform on its embedded default in one command.

It migrates the record, creates the first superadmin (from BACKENDAI_ADMIN_EMAIL
and BACKENDAI_ADMIN_PASSWORD, or generated and printed once), installs
configurable-http-proxy from npm when it is missing, prints the URL and runs
JupyterHub with the packaged configuration. Extra arguments go to jupyterhub.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from .cli import create_superadmin

CHP_VERSION = "5.3.0"


def find_or_install_chp(state: str) -> str:
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    local = os.path.join(state, "node", "node_modules", ".bin", "configurable-http-proxy")
    if not os.path.exists(local):
        if not shutil.which("npm"):
            raise SystemExit("backendai-hub: configurable-http-proxy is missing and npm is not installed")
        print(f"installing configurable-http-proxy {CHP_VERSION} with npm ...", flush=True)
        subprocess.run(
            ["npm", "install", "--silent", "--prefix", os.path.join(state, "node"),
             f"configurable-http-proxy@{CHP_VERSION}"],
            check=True,
        )
    return local


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    state = os.path.abspath(os.environ.setdefault("BACKENDAI_STATE_DIR", "backendai-state"))
    os.makedirs(state, exist_ok=True)
    db = os.environ.setdefault(
        "BACKENDAI_DB_URL", "sqlite:///" + os.path.join(state, "backendai.sqlite")
    )
    if not os.environ.get("BACKENDAI_CHP"):
        os.environ["BACKENDAI_CHP"] = find_or_install_chp(state)
    email = os.environ.get("BACKENDAI_ADMIN_EMAIL", "admin@example.com")
    out = create_superadmin(db, email, os.environ.get("BACKENDAI_ADMIN_PASSWORD"))
    if out.get("created"):
        print("first superadmin created:")
        print(json.dumps(out, indent=2))
        if "password" in out:
            print("(this password is shown once; change it after logging in)")
    url = os.environ.get("BACKENDAI_HUB_URL", "http://127.0.0.1:8000/")
    print(f"jupyterhub-backendai: log in at {url.rstrip('/')}/hub/login as {email}", flush=True)
    config = os.path.join(os.path.dirname(__file__), "share", "jupyterhub_config.py")
    os.execvp(sys.executable, [sys.executable, "-m", "jupyterhub", "-f", config, *argv])


if __name__ == "__main__":
    main()
