"""Issue 22, row 3: a session's Jupyter server serves nothing anonymously that its user
chose. alice put ``c.ServerApp.extra_static_paths = ["/home/work/www"]`` in her
persistent ``~/.jupyter/jupyter_server_config.py`` and restarted: ``<server>/static/x.html``
was served to anyone without login, a page on her own host for every visitor.

The server now takes its configuration and its extensions from the image only
(``images/kernel/backendai-kernel-init``): neither ``~/.jupyter`` nor
``~/.local/etc/jupyter`` is read. What stays the user's: JupyterLab's settings (in
``~/.jupyter/lab``, kept across restarts) and ``pip install --user`` packages in the
notebook's kernel. A real hub, the Docker backend, the kernel image.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import requests

from .conftest import containers_of

ATTACK = textwrap.dedent("""\
    mkdir -p ~/.jupyter ~/.local/etc/jupyter/jupyter_server_config.d ~/www
    echo '<p>anonymous page of alice</p>' > ~/www/x.html
    printf 'c.ServerApp.extra_static_paths = ["/home/work/www"]\\n' \\
        > ~/.jupyter/jupyter_server_config.py
    printf '{"ServerApp": {"extra_static_paths": ["/home/work/www"]}}\\n' \\
        > ~/.jupyter/jupyter_server_config.json
    printf '{"ServerApp": {"extra_static_paths": ["/home/work/www"]}}\\n' \\
        > ~/.local/etc/jupyter/jupyter_server_config.d/mine.json
    echo planted
""")


def _exec(hub, *cmd: str) -> str:
    (cid,) = containers_of(hub.agent_id)
    r = subprocess.run(["docker", "exec", "-u", "work", cid, *cmd], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_users_own_server_config_serves_nothing_anonymously(make_hub, tmp_path, docker_image):
    # (SQLite only: the record plays no part here.)
    hub = make_hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="docker")
    assert hub.spawn("admin", "").status_code in (201, 202)
    url = hub.base + hub.wait_ready("admin", "")["url"]
    auth = {"Authorization": f"token {hub.admin_token}"}
    # Her terminal: the config files, in her persistent home.
    assert _exec(hub, "sh", "-c", ATTACK).strip() == "planted"
    # A JupyterLab setting of hers, saved through the server (kept across restarts).
    setting = url + "lab/api/settings/@jupyterlab/apputils-extension:themes"
    r = requests.put(setting, headers=auth, timeout=60,
                     json={"raw": json.dumps({"theme": "JupyterLab Dark"})})
    assert r.status_code == 204, r.text
    hub.stop_server("admin", "")
    # The same through the server's environment (Backend.AI's `session create -e`, the
    # spawn's user_options): whatever steers how the server starts is refused, in words.
    for name, value in (("JUPYTER_CONFIG_PATH", "/home/work/.jupyter"),
                        ("PYTHONPATH", "/home/work"), ("PATH", "/home/work/bin:/usr/bin"),
                        ("LD_PRELOAD", "/home/work/x.so")):
        r = hub.spawn("admin", "", {"environ": {name: value}})
        assert r.status_code == 400 and name in r.text and "Jupyter server" in r.text, r.text
        assert hub.server_model("admin", "") is None
    assert hub.spawn("admin", "").status_code in (201, 202)
    url = hub.base + hub.wait_ready("admin", "")["url"]

    # Anonymous: not her page.
    r = requests.get(url + "static/x.html", timeout=60, allow_redirects=False)
    assert "anonymous page of alice" not in r.text, (r.status_code, r.text[:300])
    assert r.status_code in (302, 403, 404), r.status_code
    # Nor with her own token: the static path is simply not configured.
    r = requests.get(url + "static/x.html", headers=auth, timeout=60, allow_redirects=False)
    assert "anonymous page of alice" not in r.text and r.status_code == 404, r.status_code
    # The image's configuration is in force (its apps, from jupyter-server-proxy), and her
    # JupyterLab setting is still hers.
    info = requests.get(url + "server-proxy/servers-info", headers=auth, timeout=60)
    assert info.status_code == 200 and info.json()["server_processes"], info.text[:300]
    r = requests.get(setting, headers=auth, timeout=60)
    assert r.status_code == 200 and json.loads(r.json()["raw"])["theme"] == "JupyterLab Dark"
    assert "JupyterLab Dark" in _exec(hub, "cat", "/home/work/.jupyter/lab/user-settings/"
                                      "@jupyterlab/apputils-extension/themes.jupyterlab-settings")
    # The server runs without her site; the kernels it starts have it (pip --user).
    r = requests.post(url + "api/kernels", headers=auth, json={}, timeout=60)
    assert r.status_code == 201, r.text
    environ = "for p in $(pgrep -f {}); do tr '\\0' '\\n' < /proc/$p/environ; echo; done"
    server_env = _exec(hub, "sh", "-c", environ.format("jupyterhub-singleuser"))
    assert "PYTHONNOUSERSITE=1" in server_env.split("\n")
    assert "JUPYTER_CONFIG_DIR=/opt/backendai/jupyter-config" in server_env.split("\n")
    kernel_env = _exec(hub, "sh", "-c", environ.format("ipykernel_launcher"))
    assert kernel_env.strip() and "PYTHONNOUSERSITE" not in kernel_env, kernel_env[:500]
    hub.stop_server("admin", "")
