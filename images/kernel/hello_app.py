"""The image's custom HTTP service port: a tiny app that answers with a page of its own.

Declared in the image's ``ai.backend.service-ports`` label as ``hello:http:8070`` and
started on demand by jupyter-server-proxy (service-defs/hello.json) at
``<server>/hello/``. Its links are relative, so it works behind any prefix. It binds to
the kernel's loopback only: the one way in is the authenticated proxy.
"""

import argparse
import html
import json
import os
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    server_version = "backendai-hello/1"

    def do_GET(self):
        if self.path.split("?")[0].endswith("/info.json"):
            body = json.dumps({"app": "hello", "path": self.path,
                               "hostname": socket.gethostname(), "uid": os.getuid()}).encode()
            ctype = "application/json"
        else:
            body = (
                "<!doctype html><html><head><meta charset='utf-8'><title>Hello app</title></head>"
                "<body><h1 id='greeting'>Hello from the Backend.AI session</h1>"
                f"<p>kernel host <code id='host'>{html.escape(socket.gethostname())}</code>, "
                f"path <code id='path'>{html.escape(self.path)}</code></p>"
                "<p><a href='info.json'>info.json</a></p></body></html>"
            ).encode()
            ctype = "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8070)
    ap.add_argument("--host", default="127.0.0.1")
    a = ap.parse_args()
    ThreadingHTTPServer((a.host, a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
