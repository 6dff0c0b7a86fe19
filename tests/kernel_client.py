"""Run code in a Jupyter kernel over its websocket, the way JupyterLab does."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import uuid

import requests
from websockets.sync.client import connect


def lab_page_config(page: requests.Response) -> dict:
    """The page config (``jupyter-config-data``) of a JupyterLab page the server sent."""
    assert page.status_code == 200, page.text[:500]
    m = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                  page.text, re.S)
    assert m, page.text[:2000]
    return json.loads(html.unescape(m.group(1)))


def execute(base: str, prefix: str, token: str, code: str, timeout: float = 60) -> str:
    """Start a kernel in the server at ``base + prefix``, run ``code``, return its text result."""
    headers = {"Authorization": f"token {token}"}
    r = requests.post(f"{base}{prefix}api/kernels", json={"name": "python3"}, headers=headers,
                      timeout=60)
    r.raise_for_status()
    kernel_id = r.json()["id"]
    ws_url = base.replace("http", "ws", 1) + f"{prefix}api/kernels/{kernel_id}/channels"
    msg_id = uuid.uuid4().hex
    msg = {
        "header": {
            "msg_id": msg_id, "msg_type": "execute_request", "username": "test",
            "session": uuid.uuid4().hex, "version": "5.3",
            "date": dt.datetime.now(dt.UTC).isoformat(),
        },
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }
    try:
        with connect(ws_url, additional_headers=headers, open_timeout=timeout) as ws:
            ws.send(json.dumps(msg))
            while True:
                reply = json.loads(ws.recv(timeout=timeout))
                if reply.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = reply["header"]["msg_type"]
                if kind == "execute_result":
                    return reply["content"]["data"]["text/plain"]
                if kind == "stream":
                    return reply["content"]["text"]
                if kind == "error":
                    raise AssertionError(f"kernel error: {reply['content']}")
    finally:
        requests.delete(f"{base}{prefix}api/kernels/{kernel_id}", headers=headers, timeout=30)
