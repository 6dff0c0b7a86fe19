"""Issue 29 point 6: the local backend's agent showed 0 kernels while 3 ran. Its kernels
are processes, so their use comes from /proc (every process of the kernel's session):
the console's Agents page counts them and shows each one's memory."""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid

import requests

from .conftest import _kill_local_kernels
from .hub import Hub

PREFIX = "/hub/api/backendai"


def test_the_agents_page_counts_and_measures_local_kernels(tmp_path):
    hub = Hub(db_url=f"sqlite:///{tmp_path}/backendai.sqlite", backend="local",
              extra_args=["--Agent.heartbeat_interval=1"])
    h = None
    try:
        hub.start()
        h = {"Authorization": f"token {hub.admin_token}"}
        names = [f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        ids = []
        for i, name in enumerate(names):
            # Each holds a different amount of memory (written, so resident), in a child
            # of the kernel's shell.
            body = {"name": name, "image": "local/python", "resources": {"cpu": "0.5", "mem": "256m"},
                    "startup_command": f"python3 -c 'x = b\"1\" * ({20 + 20 * i} << 20); "
                                       "import time; time.sleep(300)'"}
            r = requests.post(hub.base + PREFIX + "/sessions", json=body, headers=h, timeout=60)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = [requests.get(hub.base + PREFIX + f"/sessions/{s}", headers=h, timeout=60).json()
                  ["status"] for s in ids]
            if st == ["RUNNING"] * 3:
                break
            assert not set(st) & {"ERROR", "TERMINATED"}, st
            time.sleep(0.2)
        else:
            raise AssertionError(f"not running: {st}")
        admin = hub.login()

        def mib(text: str) -> float:
            n, unit = re.match(r"([\d.]+) (B|KiB|MiB|GiB)", text).groups()
            return float(n) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1, "GiB": 1024}[unit]

        def held(rows: dict) -> bool:  # each python has made its bytes
            return all(n in rows and mib(rows[n]) >= 20 + 20 * i for i, n in enumerate(names))

        rows, live, page = {}, None, ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            page = admin.get(hub.base + "/hub/backendai/admin/agents", timeout=60).text
            live = re.search(r"\(sampled [^,]+, (\d+) kernels?\)", page)
            rows = dict(re.findall(r'data-session-name="([^"]+)"><td>[^<]*</td><td>[^<]*</td>'
                                   r"<td>[^<]*</td><td>([^<]*)</td>", page))
            if live and live.group(1) == "3" and held(rows):
                break
            time.sleep(0.5)
        assert live and live.group(1) == "3", (live and live.group(0), page[-3000:])
        # The bytes are in each kernel's resident memory (the python process runs in
        # the kernel's session): 20, 40, 60 MiB plus the interpreter, no limit.
        assert held(rows), rows
        for i, name in enumerate(names):
            assert mib(rows[name]) < 20 + 20 * i + 100, (name, rows[name])
            assert rows[name].endswith("of no limit"), rows[name]
    finally:
        if h:
            for s in ids:
                requests.delete(hub.base + PREFIX + f"/sessions/{s}", headers=h, timeout=60)
        hub.close()
        _kill_local_kernels(os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels"))
        shutil.rmtree(hub.dir, ignore_errors=True)
