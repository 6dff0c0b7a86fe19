"""The kernel image's directory listing (images/kernel/backendai_kernel_contents.py), in
the built image: a file renamed while its directory is listed leaves it out of that
listing, where Jupyter Server's own manager failed the whole listing with 404 and
JupyterLab said "Directory not found" over the page (a browser test, stop 34)."""

from __future__ import annotations

import json
import subprocess
import uuid

from .services import RUN

# Run in the image by its own interpreter: the server's configured contents manager,
# then 40 listings of a directory of 200 files that another process renames back and
# forth all the while, by Jupyter Server's default manager and by the image's.
_RACE = r"""
import asyncio, json, os, subprocess, sys, tempfile
from jupyter_server.serverapp import ServerApp
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

app = ServerApp()
app.load_config_file()
configured = app.contents_manager_class
root = tempfile.mkdtemp()
for i in range(200):
    open(os.path.join(root, f"a{i:03}.txt"), "w").write("x")
os.mkdir(os.path.join(root, "sub"))
open(os.path.join(root, ".hidden"), "w").write("x")
CHURN = '''
import os, sys
r = sys.argv[1]
while True:
    for i in range(200):
        os.rename(os.path.join(r, f"a{i:03}.txt"), os.path.join(r, f"b{i:03}.txt"))
    for i in range(200):
        os.rename(os.path.join(r, f"b{i:03}.txt"), os.path.join(r, f"a{i:03}.txt"))
'''

async def listings(cls, n=40):
    cm = cls(root_dir=root)
    failed, sizes = 0, []
    for _ in range(n):
        try:
            model = await cm.get("")
        except web.HTTPError:
            failed += 1
            continue
        names = {e["name"] for e in model["content"]}
        assert "sub" in names and ".hidden" not in names, names
        assert all(e["type"] in ("file", "directory") and e.get("content") is None
                   for e in model["content"]), model["content"][:3]
        sizes.append(len(names))
    return failed, sizes

churner = subprocess.Popen([sys.executable, "-c", CHURN, root])
try:
    upstream = asyncio.run(listings(AsyncLargeFileManager))
    ours = asyncio.run(listings(configured))
finally:
    churner.kill()
quiet = asyncio.run(listings(configured, 1))
print(json.dumps({"configured": f"{configured.__module__}.{configured.__name__}",
                  "upstream": upstream[0], "ours": ours[0], "ours_sizes": ours[1],
                  "quiet": quiet}))
"""


def test_a_listing_leaves_out_a_file_renamed_meanwhile(docker_image):
    name = f"t{RUN}-contents-{uuid.uuid4().hex[:6]}"
    r = subprocess.run(
        ["docker", "run", "--rm", "--name", name, "--network", "none",
         "--label", f"ai.backend.agent-id=t{RUN}-contents",
         "--entrypoint", "/opt/venv/bin/python3", docker_image, "-c", _RACE],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["configured"] == "backendai_kernel_contents.ListingContentsManager", got
    # The race happened: Jupyter Server's own manager failed listings of this directory.
    assert got["upstream"] > 0, f"no listing failed: this run did not show the race ({got})"
    # The image's: every listing answered (the files caught mid-rename left out; the
    # subdirectory always there, the hidden file never: checked in the image).
    assert got["ours"] == 0, got
    assert len(got["ours_sizes"]) == 40 and max(got["ours_sizes"]) <= 201, got["ours_sizes"]
    # Nothing moving: all of it (200 files and the subdirectory, not the hidden file).
    assert got["quiet"] == [0, [201]], got["quiet"]
