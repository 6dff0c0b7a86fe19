"""The storage proxy: one suite over the in-hub client and the HTTP daemon.

Every behaviour runs twice: through :class:`InProcessStorageClient` on a volume in a
temp dir, and through :class:`HTTPStorageClient` against a real
``backendai-storage-proxy`` subprocess (free loopback port, random token, volumes
from a ``--config`` file). Both must answer the same results and the same errors.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import tempfile
import time
import uuid

import aiohttp
import pytest

from jupyterhub_backendai.common.errors import (
    BackendAIError,
    Conflict,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    StorageQuotaExceeded,
    Unauthorized,
)
from jupyterhub_backendai.storageproxy.backends import make_volumes
from jupyterhub_backendai.storageproxy.client import (
    HTTPStorageClient,
    InProcessStorageClient,
    make_storage_registry,
)

from .services import STORAGE_PROXY_BIN, StorageDaemon, free_port


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = StorageDaemon(tmp_path_factory.mktemp("storage-http"))
    d.start()
    yield d
    d.stop()


class Env:
    """One client, the directory of its ``volume1``, and a fresh folder in a fresh
    user quota scope."""

    def __init__(self, kind: str, client, root: str):
        self.kind = kind
        self.client = client
        self.root = root
        self.scope = f"user:{uuid.uuid4().hex}"
        self.folder = uuid.uuid4().hex

    @property
    def path(self) -> str:
        kind, sid = self.scope.split(":")
        return os.path.join(self.root, kind, sid, self.folder)

    def __getattr__(self, op):
        """``env.upload(path, ...)`` = ``client.upload("volume1", scope, folder, path, ...)``."""
        fn = getattr(self.client, op)

        async def call(*args, **kw):
            return await fn("volume1", self.scope, self.folder, *args, **kw)

        return call

    def leftovers(self) -> list[str]:
        """Temporary upload files anywhere under the folder."""
        out = []
        for dirpath, _dirs, files in os.walk(self.path):
            out.extend(os.path.join(dirpath, f) for f in files if f.startswith(".upload-"))
        return out


@pytest.fixture(params=["inproc", "http"])
async def env(request, tmp_path):
    if request.param == "inproc":
        volumes = {
            n: {"backend": "vfs", "path": str(tmp_path / n)} for n in ("volume1", "volume2")
        }
        client = InProcessStorageClient(make_volumes(volumes))
        root = volumes["volume1"]["path"]
    else:
        d = request.getfixturevalue("daemon")
        client = HTTPStorageClient(d.url, d.token)
        root = d.volumes["volume1"]["path"]
    e = Env(request.param, client, root)
    await e.create_folder()
    yield e
    await client.close()


async def stream(data: bytes, size: int = 64 * 1024):
    for i in range(0, len(data), size):
        yield data[i : i + size]
        await asyncio.sleep(0)


async def read_all(env, path: str) -> bytes:
    size, chunks = await env.download(path)
    data = b"".join([c async for c in chunks])
    assert len(data) == size
    return data


async def wait_until(cond, timeout: float = 10) -> None:
    """Poll a condition (the daemon cleans up after a dropped connection on its own time)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# -- folders ---------------------------------------------------------------------


async def test_create_and_delete_folder_are_idempotent(env):
    assert os.path.isdir(env.path)
    with open(os.path.join(env.path, "keep"), "w") as f:
        f.write("x")
    await env.create_folder()  # again: left as it is
    assert os.listdir(env.path) == ["keep"]
    assert await env.mount_path() == env.path
    await env.delete_folder()
    assert not os.path.exists(env.path)
    await env.delete_folder()  # again: no error
    with pytest.raises(NotFound) as e:
        await env.folder_usage()
    assert e.value.status_code == 404 and env.folder in e.value.detail


async def test_volumes_lists_both(env):
    names = sorted(v["name"] for v in await env.client.volumes())
    assert names == ["volume1", "volume2"]


# -- usage and quota -------------------------------------------------------------


async def test_usage_counts_bytes_and_files_without_following_links(env):
    await env.mkdir("d/e", parents=True)
    await env.upload("a.bin", stream(b"a" * 1000))
    await env.upload("d/b.bin", stream(b"b" * 2500))
    await env.upload("d/e/c.bin", stream(b""))
    outside = tempfile.mkdtemp(prefix="sp-outside-")
    with open(os.path.join(outside, "big"), "wb") as f:
        f.write(b"z" * 100_000)
    link = os.path.join(env.path, "d", "out")
    os.symlink(outside, link)
    link_size = os.lstat(link).st_size
    assert await env.folder_usage() == {"used_bytes": 3500 + link_size, "file_count": 4}

    other = uuid.uuid4().hex
    await env.client.create_folder("volume1", env.scope, other)
    await env.client.upload("volume1", env.scope, other, "x", stream(b"x" * 500))
    assert await env.client.scope_usage("volume1", env.scope) == {
        "used_bytes": 4000 + link_size,
        "file_count": 5,
    }
    empty_scope = f"project:{uuid.uuid4().hex}"
    assert await env.client.scope_usage("volume1", empty_scope) == {"used_bytes": 0, "file_count": 0}


async def test_many_folders_usage_in_one_request_in_order(env):
    """What a folder listing asks: each folder's usage in one request, in the order asked,
    null for one that is not there (deleted meanwhile), the same as one by one."""
    other = uuid.uuid4().hex
    await env.client.create_folder("volume1", env.scope, other)
    await env.upload("a", stream(b"a" * 700))
    await env.client.upload("volume1", env.scope, other, "b", stream(b"b" * 40))
    gone = (env.scope, uuid.uuid4().hex)
    asked = [(env.scope, other), gone, (env.scope, env.folder)]
    got = await env.client.folders_usage("volume1", asked)
    assert got == [{"used_bytes": 40, "file_count": 1}, None,
                   {"used_bytes": 700, "file_count": 1}]
    assert got[2] == await env.folder_usage()
    assert await env.client.folders_usage("volume1", []) == []
    with pytest.raises(InvalidRequest) as e:  # a bad id anywhere: the whole request
        await env.client.folders_usage("volume1", [(env.scope, "../../etc")])
    assert e.value.status_code == 400
    with pytest.raises(NotFound):
        await env.client.folders_usage("nope", asked)


async def test_many_folders_usage_refuses_a_malformed_body(daemon):
    """The daemon's ``folders-usage`` route says what its body must be, and bounds it."""
    client = HTTPStorageClient(daemon.url, daemon.token)
    try:
        for body in ({}, {"folders": "x"}, {"folders": [["user:x", "y"]]},
                     {"folders": [{"quota_scope_id": 1, "folder_id": "y"}]},
                     {"folders": [{"quota_scope_id": "user:" + "0" * 32,
                                   "folder_id": "0" * 32}] * 1001}):
            with pytest.raises(InvalidRequest) as e:
                await client._call("POST", "/v1/volumes/volume1/folders-usage", body=body)
            assert e.value.status_code == 400 and "folders" in e.value.detail, body
    finally:
        await client.close()


async def test_quota_scope_limit_is_stored_and_cleared(env):
    await env.upload("f", stream(b"f" * 300))
    assert await env.client.quota_scope("volume1", env.scope) == {"limit_bytes": None, "used_bytes": 300}
    await env.client.set_quota_scope("volume1", env.scope, 1000)
    assert await env.client.quota_scope("volume1", env.scope) == {"limit_bytes": 1000, "used_bytes": 300}
    # the limit file lies beside the folders, not inside one, and is not counted
    assert sorted(os.listdir(os.path.dirname(env.path))) == [".quota.json", env.folder]
    assert (await env.client.scope_usage("volume1", env.scope))["used_bytes"] == 300
    await env.client.set_quota_scope("volume1", env.scope, None)
    assert await env.client.quota_scope("volume1", env.scope) == {"limit_bytes": None, "used_bytes": 300}
    for bad in (-1, "100", True, 1.5):
        with pytest.raises(InvalidRequest) as e:
            await env.client.set_quota_scope("volume1", env.scope, bad)
        assert e.value.status_code == 400 and "limit_bytes" in e.value.detail
    assert (await env.client.quota_scope("volume1", env.scope))["limit_bytes"] is None


async def test_upload_over_quota_is_refused_and_leaves_nothing(env):
    await env.upload("old", stream(b"o" * 600))
    await env.client.set_quota_scope("volume1", env.scope, 1000)
    with pytest.raises(StorageQuotaExceeded) as e:
        await env.upload("new", stream(b"n" * 401, size=100))
    assert e.value.status_code == 413
    assert isinstance(e.value, QuotaExceeded)
    assert "limited to 1000 bytes" in e.value.detail and "600 are used" in e.value.detail
    assert sorted(os.listdir(env.path)) == ["old"]
    assert env.leftovers() == []
    # exactly up to the limit is allowed
    assert await env.upload("new", stream(b"n" * 400)) == {"path": "new", "size": 400}
    assert (await env.client.quota_scope("volume1", env.scope))["used_bytes"] == 1000
    # replacing a file counts its old bytes as freed
    await env.upload("old", stream(b"p" * 600))
    assert await read_all(env, "old") == b"p" * 600


async def test_quota_counts_every_folder_of_the_scope(env):
    other = uuid.uuid4().hex
    await env.client.create_folder("volume1", env.scope, other)
    await env.client.upload("volume1", env.scope, other, "x", stream(b"x" * 900))
    await env.client.set_quota_scope("volume1", env.scope, 1000)
    with pytest.raises(StorageQuotaExceeded):
        await env.upload("y", stream(b"y" * 101))
    assert os.listdir(env.path) == []
    # a limit below what is used already refuses any upload
    await env.client.set_quota_scope("volume1", env.scope, 10)
    with pytest.raises(StorageQuotaExceeded) as e:
        await env.upload("z", stream(b""))
    assert "900 are used" in e.value.detail
    assert os.listdir(env.path) == []


async def test_a_folders_own_limit_bounds_its_uploads_below_the_scopes(env):
    """Backend.AI's per-folder ``max_size``: a limit of one folder, tighter than its
    scope's, stops uploads into that folder only; a clone keeps it; deleting the folder
    drops it."""
    await env.client.set_quota_scope("volume1", env.scope, 10_000)
    await env.client.set_folder_quota("volume1", env.scope, env.folder, 1000)
    assert await env.client.folder_quota("volume1", env.scope, env.folder) == {
        "limit_bytes": 1000, "used_bytes": 0}
    await env.upload("a", stream(b"a" * 600))
    with pytest.raises(StorageQuotaExceeded) as e:
        await env.upload("b", stream(b"b" * 401, size=100))
    assert e.value.status_code == 413
    assert f"folder {env.folder}" in e.value.detail and "limited to 1000 bytes" in e.value.detail
    assert sorted(os.listdir(env.path)) == ["a"] and env.leftovers() == []
    assert await env.upload("b", stream(b"b" * 400)) == {"path": "b", "size": 400}
    # another folder of the scope has the scope's room, not this folder's
    other = uuid.uuid4().hex
    await env.client.create_folder("volume1", env.scope, other)
    await env.client.upload("volume1", env.scope, other, "x", stream(b"x" * 5000))
    # the limit file lies beside the folders and counts for nothing
    scope_dir = os.path.dirname(env.path)
    assert ".folder-quotas.json" in os.listdir(scope_dir)
    assert (await env.client.scope_usage("volume1", env.scope))["used_bytes"] == 6000
    # a clone keeps its source's limit
    clone = uuid.uuid4().hex
    await env.client.clone_folder("volume1", env.scope, env.folder, env.scope, clone)
    assert await env.client.folder_quota("volume1", env.scope, clone) == {
        "limit_bytes": 1000, "used_bytes": 1000}
    with pytest.raises(StorageQuotaExceeded):
        await env.client.upload("volume1", env.scope, clone, "c", stream(b"c"))
    # bad limits and missing folders
    for bad in (-1, "100", True, 1.5):
        with pytest.raises(InvalidRequest) as e:
            await env.client.set_folder_quota("volume1", env.scope, env.folder, bad)
        assert e.value.status_code == 400 and "limit_bytes" in e.value.detail
    with pytest.raises(NotFound):
        await env.client.set_folder_quota("volume1", env.scope, uuid.uuid4().hex, 10)
    # without it only the scope bounds the folder; a deleted folder's limit goes with it
    await env.client.set_folder_quota("volume1", env.scope, env.folder, None)
    assert await env.upload("c", stream(b"c" * 2000)) == {"path": "c", "size": 2000}
    await env.client.delete_folder("volume1", env.scope, clone)
    assert ".folder-quotas.json" not in os.listdir(scope_dir)


async def test_clone_copies_a_folder_whole_and_independent(env):
    await env.mkdir("d/e", parents=True)
    await env.upload("d/e/f", stream(b"f" * 3000))
    os.symlink("/etc/passwd", os.path.join(env.path, "link"))
    target = uuid.uuid4().hex
    await env.client.clone_folder("volume1", env.scope, env.folder, env.scope, target)
    copy = os.path.join(os.path.dirname(env.path), target)
    with open(os.path.join(copy, "d/e/f"), "rb") as f:
        assert f.read() == b"f" * 3000
    assert os.readlink(os.path.join(copy, "link")) == "/etc/passwd"  # a link, not its target
    assert not [n for n in os.listdir(os.path.dirname(env.path)) if n.startswith(".clone-")]
    await env.client.upload("volume1", env.scope, target, "d/e/f", stream(b"g"))
    assert await read_all(env, "d/e/f") == b"f" * 3000  # the source is its own
    with pytest.raises(Conflict):  # the target exists
        await env.client.clone_folder("volume1", env.scope, env.folder, env.scope, target)
    with pytest.raises(NotFound):
        await env.client.clone_folder("volume1", env.scope, uuid.uuid4().hex, env.scope,
                                      uuid.uuid4().hex)
    # a scope without room for it gets nothing
    small, third = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    await env.client.set_quota_scope("volume1", small, 1000)
    with pytest.raises(StorageQuotaExceeded):
        await env.client.clone_folder("volume1", env.scope, env.folder, small, third)
    kind, sid = small.split(":")
    assert [n for n in os.listdir(os.path.join(env.root, kind, sid)) if n != ".quota.json"] == []


# -- uploads and downloads -------------------------------------------------------


async def test_download_equals_upload_streamed(env):
    data = os.urandom(5 * 1024 * 1024 + 123)
    assert await env.upload("big.bin", stream(data)) == {
        "path": "big.bin",
        "size": len(data),
    }
    with open(os.path.join(env.path, "big.bin"), "rb") as f:
        assert f.read() == data
    size, chunks = await env.download("big.bin")
    assert size == len(data)
    parts = [c async for c in chunks]
    assert len(parts) > 1  # streamed, not one body
    assert b"".join(parts) == data
    assert env.leftovers() == []


def open_fds_on(pid: int, path: str) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == path
        except OSError:
            pass
    return n


async def test_abandoned_download_closes_the_file(env, request):
    data = os.urandom(8 * 1024 * 1024)
    await env.upload("big", stream(data))
    pid = request.getfixturevalue("daemon").proc.pid if env.kind == "http" else os.getpid()
    target = os.path.join(env.path, "big")
    size, chunks = await env.download("big")
    first = await chunks.__anext__()
    assert size == len(data) and data.startswith(first) and len(first) < size
    assert open_fds_on(pid, target) == 1
    await chunks.aclose()
    await wait_until(lambda: open_fds_on(pid, target) == 0)
    assert await read_all(env, "big") == data  # and the proxy still serves it


async def test_failed_upload_keeps_the_old_file(env):
    await env.upload("a.txt", stream(b"old contents"))

    async def broken():
        yield b"new " * 100_000
        # the proxy has begun writing beside the old file before the source fails
        await wait_until(lambda: env.leftovers() != [])
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        await env.upload("a.txt", broken())
    await wait_until(lambda: env.leftovers() == [])
    assert await read_all(env, "a.txt") == b"old contents"
    assert sorted(os.listdir(env.path)) == ["a.txt"]


async def test_readers_see_the_old_file_until_the_upload_completes(env):
    await env.upload("f", stream(b"old"))
    halfway = asyncio.Event()
    go_on = asyncio.Event()

    async def slow():
        yield b"new" * 500_000
        halfway.set()
        await go_on.wait()
        yield b"end"

    task = asyncio.ensure_future(env.upload("f", slow()))
    await halfway.wait()
    await wait_until(lambda: env.leftovers() != [])  # the new bytes are on disk, aside
    assert await read_all(env, "f") == b"old"
    go_on.set()
    assert (await task)["size"] == 1_500_003
    assert await read_all(env, "f") == b"new" * 500_000 + b"end"
    assert env.leftovers() == []


async def test_concurrent_uploads_to_one_path_leave_one_whole_file(env):
    a, b = os.urandom(3_000_000), os.urandom(3_000_000)
    await asyncio.gather(env.upload("f", stream(a)), env.upload("f", stream(b)))
    assert await read_all(env, "f") in (a, b)
    assert os.listdir(env.path) == ["f"]


async def test_created_entries_belong_to_the_kernel_user_when_root(env):
    await env.mkdir("d/e", parents=True)
    await env.mkdir("d/x")
    await env.upload("d/e/f", stream(b"x"))
    owner = (1000, 1000) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    for rel in ("", "d", "d/e", "d/x", "d/e/f"):
        st = os.lstat(os.path.join(env.path, rel))
        assert (st.st_uid, st.st_gid) == owner, rel


async def test_upload_into_missing_directory_or_onto_a_directory(env):
    with pytest.raises(NotFound) as e:
        await env.upload("nodir/f", stream(b"x"))
    assert e.value.status_code == 404 and "nodir" in e.value.detail
    await env.mkdir("d")
    with pytest.raises(Conflict) as e:
        await env.upload("d", stream(b"x"))
    assert e.value.status_code == 409 and "is a directory" in e.value.detail
    assert os.listdir(env.path) == ["d"] and env.leftovers() == []


async def test_download_refuses_directories_and_missing_files(env):
    await env.mkdir("d")
    with pytest.raises(InvalidRequest) as e:
        await env.download("d")
    assert e.value.status_code == 400 and "directory" in e.value.detail
    with pytest.raises(NotFound) as e:
        await env.download("nothing")
    assert e.value.status_code == 404


# -- file operations -------------------------------------------------------------


async def test_list_mkdir_rename_delete(env):
    await env.mkdir("a")
    with pytest.raises(Conflict) as e:
        await env.mkdir("a")
    assert e.value.status_code == 409
    with pytest.raises(NotFound):
        await env.mkdir("x/y")
    await env.mkdir("x/y", parents=True)
    await env.mkdir("x/y", parents=True)  # mkdir -p: no error
    await env.upload("a/f.txt", stream(b"hello"))
    os.symlink("f.txt", os.path.join(env.path, "a", "ln"))

    entries = await env.list_files("a")
    assert [(x["name"], x["type"], x["size"]) for x in entries] == [
        ("f.txt", "file", 5),
        ("ln", "symlink", len("f.txt")),
    ]
    assert all(isinstance(x["mtime"], float) for x in entries)
    assert [(x["name"], x["type"]) for x in await env.list_files("")] == [("a", "dir"), ("x", "dir")]
    assert [x["name"] for x in await env.list_files("x/")] == ["y"]
    with pytest.raises(InvalidRequest):
        await env.list_files("a/f.txt")  # not a directory
    with pytest.raises(NotFound):
        await env.list_files("nope")

    await env.rename("a/f.txt", "x/y/g.txt")
    assert await read_all(env, "x/y/g.txt") == b"hello"
    assert not os.path.exists(os.path.join(env.path, "a", "f.txt"))
    await env.upload("a/h", stream(b"h"))
    with pytest.raises(Conflict):
        await env.rename("a/h", "x/y/g.txt")  # an existing destination is not replaced
    assert await read_all(env, "x/y/g.txt") == b"hello"
    with pytest.raises(NotFound):
        await env.rename("a/missing", "a/other")
    with pytest.raises(InvalidRequest):
        await env.rename("x", "x/y/inside")  # a directory into itself

    with pytest.raises(Conflict) as e:
        await env.delete("x")
    assert "not empty" in e.value.detail
    await env.delete("a/ln")  # the link, not its target
    await env.delete("a/h")
    await env.delete("a")
    await env.delete("x", recursive=True)
    assert os.listdir(env.path) == []
    with pytest.raises(NotFound):
        await env.delete("x")
    with pytest.raises(InvalidRequest):
        await env.delete("")  # the folder itself


async def test_names_are_kept_exactly(env):
    names = [" spaced out ", "ü€.txt", "q?x#y%20z&path=..", "tab\there", "-"]
    for n in names:
        await env.upload(n, stream(n.encode()))
    assert sorted(os.listdir(env.path)) == sorted(names)
    assert [e["name"] for e in await env.list_files("")] == sorted(names)
    for n in names:
        assert await read_all(env, n) == n.encode()
    await env.rename(" spaced out ", "  ")
    await env.delete("  ")
    assert "  " not in os.listdir(env.path)


BAD_PATHS = ["../x", "a/../../x", "..", "/etc/passwd", "a\x00b"]


@pytest.mark.parametrize("bad", BAD_PATHS)
async def test_bad_paths_are_refused(env, bad):
    await env.mkdir("a")
    calls = [
        env.list_files(bad),
        env.mkdir(bad),
        env.mkdir(bad, parents=True),
        env.rename(bad, "b"),
        env.rename("a", bad),
        env.delete(bad, recursive=True),
        env.upload(bad, stream(b"x")),
        env.download(bad),
    ]
    for call in calls:
        with pytest.raises(InvalidRequest) as e:
            await call
        assert e.value.status_code == 400
    assert os.listdir(env.path) == ["a"]
    assert not os.path.exists(os.path.join(os.path.dirname(env.path), "x"))


async def test_symlinks_are_not_followed_out_of_the_folder(env):
    outside = tempfile.mkdtemp(prefix="sp-outside-")
    with open(os.path.join(outside, "secret"), "w") as f:
        f.write("secret")
    os.symlink(outside, os.path.join(env.path, "out"))
    os.symlink("/etc/passwd", os.path.join(env.path, "passwd"))

    for call in (
        env.download("out/secret"),
        env.download("passwd"),
        env.list_files("out"),
        env.upload("out/new", stream(b"x")),
        env.upload("out/secret", stream(b"overwritten")),
        env.mkdir("out/d"),
        env.mkdir("out/d", parents=True),
        env.rename("out/secret", "stolen"),
        env.delete("out/secret"),
    ):
        with pytest.raises(InvalidRequest) as e:
            await call
        assert e.value.status_code == 400 and "symbolic link" in e.value.detail
    assert sorted(os.listdir(outside)) == ["secret"]
    with open(os.path.join(outside, "secret")) as f:
        assert f.read() == "secret"
    # replacing a link by an upload replaces the link itself, never its target
    await env.upload("passwd", stream(b"mine"))
    assert not os.path.islink(os.path.join(env.path, "passwd"))
    assert await read_all(env, "passwd") == b"mine"
    # deleting a link leaves its target
    await env.delete("out", recursive=True)
    assert os.listdir(outside) == ["secret"]


# -- ids and volumes -------------------------------------------------------------


@pytest.mark.parametrize(
    "scope,folder",
    [
        ("user:xyz", None),
        ("group:" + "0" * 32, None),
        ("user:" + "A" * 32, None),
        (None, "../../etc"),
        (None, "0" * 31),
        (None, "g" * 32),
    ],
)
async def test_bad_ids_are_400(env, scope, folder):
    scope = scope or env.scope
    folder = folder or env.folder
    c = env.client
    for call in (
        c.create_folder("volume1", scope, folder),
        c.delete_folder("volume1", scope, folder),
        c.folder_usage("volume1", scope, folder),
        c.list_files("volume1", scope, folder, ""),
        c.upload("volume1", scope, folder, "f", stream(b"x")),
    ):
        with pytest.raises(InvalidRequest) as e:
            await call
        assert e.value.status_code == 400 and "invalid" in e.value.detail
    assert os.listdir(env.path) == []


async def test_unknown_volume_is_404(env):
    for call in (
        env.client.create_folder("nope", env.scope, env.folder),
        env.client.quota_scope("nope", env.scope),
        env.client.upload("nope", env.scope, env.folder, "f", stream(b"x")),
        env.client.download("nope", env.scope, env.folder, "f"),
    ):
        with pytest.raises(NotFound) as e:
            await call
        assert e.value.status_code == 404 and "'nope'" in e.value.detail


# -- the daemon ------------------------------------------------------------------


async def test_wrong_or_missing_token_is_401(daemon):
    client = HTTPStorageClient(daemon.url, "wrong-" + daemon.token)
    try:
        with pytest.raises(Unauthorized) as e:
            await client.volumes()
        assert e.value.status_code == 401
        scope = f"user:{uuid.uuid4().hex}"
        with pytest.raises(Unauthorized):
            await client.create_folder("volume1", scope, uuid.uuid4().hex)
        with pytest.raises(Unauthorized):  # refused before a byte is written
            await client.upload("volume1", scope, uuid.uuid4().hex, "f", stream(b"x" * 3_000_000))
    finally:
        await client.close()
    assert not os.path.exists(os.path.join(daemon.volumes["volume1"]["path"], "user", scope[5:]))
    async with aiohttp.ClientSession() as s:
        async with s.get(daemon.url + "/v1/volumes") as r:
            assert r.status == 401
            assert r.headers["Content-Type"] == "application/problem+json"
            body = await r.json(content_type=None)
            assert body["status"] == 401 and body["error"] == "Unauthorized"
        auth = {"Authorization": f"Bearer {daemon.token}"}
        async with s.get(daemon.url + "/v1/nothing", headers=auth) as r:
            assert r.status == 404 and (await r.json(content_type=None))["error"] == "NotFound"
        url = f"{daemon.url}/v1/volumes/volume1/folders/user:{'a' * 32}/..%2F..%2Fetc/usage"
        async with s.get(url, headers=auth) as r:
            assert r.status == 400
            assert r.headers["Content-Type"] == "application/problem+json"
            body = await r.json(content_type=None)
            assert body["error"] == "InvalidRequest" and body["status"] == 400
            assert body["detail"] == "invalid folder id '../../etc'"


async def test_unreachable_daemon_is_502():
    client = HTTPStorageClient(f"http://127.0.0.1:{free_port()}", "t")
    try:
        with pytest.raises(BackendAIError) as e:
            await client.volumes()
        assert e.value.status_code == 502 and "storage proxy at http://127.0.0.1:" in e.value.detail
    finally:
        await client.close()


async def test_daemon_refuses_to_start_without_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BACKENDAI_STORAGE_TOKEN"}
    r = subprocess.run(
        [STORAGE_PROXY_BIN, f"--StorageProxyApp.volumes={{'v': {{'path': '{tmp_path}'}}}}", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert r.returncode != 0 and "token" in r.stderr


async def test_daemon_refuses_an_unknown_backend(tmp_path):
    conf = tmp_path / "bad.py"
    conf.write_text(f"c.StorageProxyApp.volumes = {{'v': {{'backend': 'xfs', 'path': '{tmp_path}'}}}}\n")
    r = subprocess.run(
        [STORAGE_PROXY_BIN, "--config", str(conf), "--port", str(free_port())],
        env=dict(os.environ, BACKENDAI_STORAGE_TOKEN="t"), capture_output=True, text=True, timeout=30,
    )
    assert r.returncode != 0 and "unknown backend 'xfs'" in r.stderr


async def test_registry_hosts_and_pass_through_over_both(daemon, tmp_path):
    registry = make_storage_registry(
        {"remote": {"url": daemon.url, "token": daemon.token}},
        {"volume1": {"backend": "vfs", "path": str(tmp_path / "local1")}},
    )
    try:
        assert await registry.hosts() == [
            "local:volume1",
            "remote:volume1",
            "remote:volume2",
        ]
        scope, folder = f"project:{uuid.uuid4().hex}", uuid.uuid4().hex
        for host, root in (
            ("local:volume1", str(tmp_path / "local1")),
            ("remote:volume2", daemon.volumes["volume2"]["path"]),
        ):
            await registry.create_folder(host, scope, folder)
            path = os.path.join(root, "project", scope.split(":")[1], folder)
            assert await registry.mount_path(host, scope, folder) == path
            await registry.set_quota_scope(host, scope, 100)
            await registry.mkdir(host, scope, folder, "d")
            assert await registry.upload(host, scope, folder, "d/f", stream(b"12345")) == {
                "path": "d/f",
                "size": 5,
            }
            await registry.rename(host, scope, folder, "d/f", "d/g")
            assert [e["name"] for e in await registry.list_files(host, scope, folder, "d")] == ["g"]
            size, chunks = await registry.download(host, scope, folder, "d/g")
            assert (size, b"".join([c async for c in chunks])) == (5, b"12345")
            assert await registry.folder_usage(host, scope, folder) == {"used_bytes": 5, "file_count": 1}
            assert await registry.scope_usage(host, scope) == {"used_bytes": 5, "file_count": 1}
            assert await registry.quota_scope(host, scope) == {"limit_bytes": 100, "used_bytes": 5}
            with pytest.raises(StorageQuotaExceeded):
                await registry.upload(host, scope, folder, "big", stream(b"x" * 96))
            await registry.delete(host, scope, folder, "d", recursive=True)
            await registry.delete_folder(host, scope, folder)
            assert not os.path.exists(path)
        with pytest.raises(InvalidRequest):
            registry.resolve("elsewhere:volume1")
    finally:
        await registry.close()


# -- trees of any depth (issue 10, row 11) --------------------------------------


def make_deep_tree(top: str, depth: int, leaf: bytes) -> None:
    """What a kernel can do in its mounted folder: ``depth`` nested directories
    ``d/d/d/...`` made one at a time relative to the last (openat), a file at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        wfd = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, leaf)
        os.close(wfd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("depth", [1500, 5000])
async def test_a_deep_tree_breaks_neither_usage_nor_upload_nor_delete(env, depth):
    """The walks (usage, quota check, recursive delete, folder delete) use no recursion:
    a tree deeper than Python's recursion limit and the open-files limit of a walk that
    keeps every level open is counted and deleted like any other."""
    make_deep_tree(env.path, depth, b"12345")
    assert await env.folder_usage() == {"used_bytes": 5, "file_count": 1}
    assert (await env.client.scope_usage("volume1", env.scope))["used_bytes"] == 5
    # An upload checks the scope's usage against its limit first.
    await env.client.set_quota_scope("volume1", env.scope, 1000)
    assert (await env.upload("top.txt", stream(b"abc")))["size"] == 3
    assert (await env.client.quota_scope("volume1", env.scope))["used_bytes"] == 8
    names = {e["name"]: e["type"] for e in await env.list_files("")}
    assert names == {"d": "dir", "top.txt": "file"}
    # Deleting the tree recursively leaves the rest of the folder.
    await env.delete("d", recursive=True)
    assert sorted(os.listdir(env.path)) == ["top.txt"]
    assert await env.folder_usage() == {"used_bytes": 3, "file_count": 1}
    # Deleting the whole folder with such a tree in it.
    make_deep_tree(env.path, depth, b"x")
    await env.delete_folder()
    assert not os.path.exists(env.path)


async def test_deep_tree_delete_removes_links_not_their_targets(env, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    make_deep_tree(env.path, 50, b"x")
    bottom = os.path.join(env.path, *["d"] * 50)
    os.symlink(str(outside), os.path.join(bottom, "link"))
    await env.delete("d", recursive=True)
    assert os.listdir(env.path) == []
    assert (outside / "keep").read_text() == "keep"


# -- modes and secrets (issue 10, row 13) ---------------------------------------


async def test_folders_and_their_directories_are_private_to_the_kernel_user(env):
    await env.mkdir("a/b", parents=True)
    await env.mkdir("c")
    for rel in ("", "a", "a/b", "c"):
        assert stat_mode(os.path.join(env.path, rel)) == 0o700, rel


def stat_mode(path: str) -> int:
    return os.lstat(path).st_mode & 0o7777


def test_help_all_prints_no_secret():
    """Secrets given in the environment are read when used, never shown as defaults."""
    secret = "s3cr3t-" + uuid.uuid4().hex
    r = subprocess.run(
        [STORAGE_PROXY_BIN, "--help-all"],
        env=dict(os.environ, BACKENDAI_STORAGE_TOKEN=secret), capture_output=True, text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "StorageProxyApp.token" in r.stdout
    assert secret not in r.stdout + r.stderr


# -- direct transfers on the daemon's client port (cluster mode) ----------------------


def test_daemon_serves_tus_and_downloads_on_its_client_port(tmp_path):
    """Clients upload (tus) and download straight to the daemon, authorized only by
    a token signed with the secret the daemon shares with the manager; the node API's
    mutual TLS/token is not needed, a forged token is refused."""
    import requests
    from tusclient import client as tus_client

    from jupyterhub_backendai.storageproxy.transfer import (
        TransferTokens,
        download_claims,
        upload_claims,
    )

    secret = uuid.uuid4().hex
    cport = free_port()
    d = StorageDaemon(tmp_path, extra_config=(
        f"c.StorageProxyApp.client_port = {cport}\n"
        "c.StorageProxyApp.client_host = '127.0.0.1'\n"
        # small transfers in worker threads here (the next test: on the loop)
        "c.StorageProxyApp.transfer_inline_io = False\n"
        f"c.TransferTokens.secret = {secret!r}\n"))
    d.start()
    try:
        scope, fid = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
        client = HTTPStorageClient(d.url, d.token)
        try:
            asyncio.run(client.create_folder("volume1", scope, fid))
        finally:
            asyncio.run(client.close())
        folder = os.path.join(d.volumes["volume1"]["path"], "user", scope[5:], fid)
        tokens = TransferTokens(secret=secret)
        data = os.urandom(3 * 2**20 + 17)
        base = f"http://127.0.0.1:{cport}"
        url = f"{base}/upload?token=" + tokens.sign(
            upload_claims("volume1", scope, fid, "x.bin", len(data)))
        up = tus_client.TusClient(url).uploader(file_stream=io.BytesIO(data), chunk_size=2**20)
        up.upload(stop_at=2**20)
        assert os.listdir(folder) == []
        up.upload()
        with open(os.path.join(folder, "x.bin"), "rb") as fh:
            assert fh.read() == data
        durl = f"{base}/download?token=" + tokens.sign(
            download_claims("volume1", scope, fid, "x.bin"))
        r = requests.get(durl, headers={"Range": "bytes=5-9"}, timeout=30)
        assert (r.status_code, r.content) == (206, data[5:10])
        small = f"{base}/upload?token=" + tokens.sign(
            upload_claims("volume1", scope, fid, "s.bin", 3))
        r = requests.patch(small, data=b"abc", timeout=30, headers={
            "Tus-Resumable": "1.0.0", "Upload-Offset": "0",
            "Content-Type": "application/offset+octet-stream"})
        assert (r.status_code, r.headers["Upload-Offset"]) == (204, "3")
        with open(os.path.join(folder, "s.bin"), "rb") as fh:
            assert fh.read() == b"abc"
        assert requests.get(durl, timeout=30).content == data
        forged = TransferTokens(secret="not-the-secret").sign(
            download_claims("volume1", scope, fid, "x.bin"))
        r = requests.get(f"{base}/download?token={forged}", timeout=30)
        assert r.status_code == 401 and "signature" in r.json()["title"]
        r = requests.get(f"{base}/v1/volumes", timeout=30)  # the node API is not here
        assert r.status_code == 404
        # An anonymous 20 MiB body on either port is dropped as it arrives, not held
        # (common/bodylimit.py), and answered in words.
        for url in (f"{base}/v1/volumes", f"{d.url}/v1/volumes"):
            r = requests.post(url, data=b"\0" * (20 * 2**20), timeout=60)
            assert r.status_code == 413, (url, r.status_code, r.text[:200])
            assert "request body too large: at most 1 MiB" in r.json()["detail"], r.text
    finally:
        d.stop()


def _raw_http(port: int, head: str, body: bytes = b"", expect: bool = False) -> tuple[int, dict, bytes]:
    """One request on a socket of its own: (status, headers, body). With ``expect``,
    the body is sent only after the server's ``100 Continue``."""
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(head.encode())
        data = b""
        if expect:
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            interim, _, data = data.partition(b"\r\n\r\n")
            assert interim.startswith(b"HTTP/1.1 100"), interim
        s.sendall(body)
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        top, _, rest = data.partition(b"\r\n\r\n")
        lines = top.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        n = int(headers.get("content-length", "0"))
        while len(rest) < n:
            chunk = s.recv(65536)
            assert chunk, "short body"
            rest += chunk
        return int(lines[0].split()[1]), headers, rest
    finally:
        s.close()


def test_daemon_large_transfers_on_taken_over_connections(tmp_path):
    """Bodies and files of RAW_MIN and more leave tornado's buffers (the connection is
    taken over, sendfile for downloads): the same protocol and checks as the small
    ones, Expect: 100-continue, ranges, the quota while writing, a body past the
    upload's length refused, and small bodies checked whole before they are written."""
    from jupyterhub_backendai.storageproxy.transfer import (
        RAW_MIN,
        TransferTokens,
        download_claims,
        upload_claims,
    )

    secret = uuid.uuid4().hex
    cport = free_port()
    d = StorageDaemon(tmp_path, extra_config=(
        f"c.StorageProxyApp.client_port = {cport}\n"
        "c.StorageProxyApp.client_host = '127.0.0.1'\n"
        f"c.TransferTokens.secret = {secret!r}\n"))
    d.start()
    tokens = TransferTokens(secret=secret)
    scope, fid = f"user:{uuid.uuid4().hex}", uuid.uuid4().hex
    client = HTTPStorageClient(d.url, d.token)

    async def prepare():
        try:
            await client.create_folder("volume1", scope, fid)
            await client.set_quota_scope("volume1", scope, 3 * RAW_MIN)
        finally:
            await client.close()

    def patch(path, size, offset, body, expect=False, length=None):
        target = "/upload?token=" + tokens.sign(upload_claims("volume1", scope, fid, path, size))
        head = (f"PATCH {target} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
                f"Upload-Offset: {offset}\r\nContent-Type: application/offset+octet-stream\r\n"
                f"Content-Length: {len(body) if length is None else length}\r\n"
                + ("Expect: 100-continue\r\n" if expect else "") + "\r\n")
        return _raw_http(cport, head, body, expect), target

    try:
        asyncio.run(prepare())
        kind, sid = scope.split(":")
        folder = os.path.join(d.volumes["volume1"]["path"], kind, sid, fid)
        staging = os.path.join(d.volumes["volume1"]["path"], kind, sid, ".tus")
        data = os.urandom(2 * RAW_MIN + 5)
        # Expect: 100-continue (curl sends it for big bodies), in two PATCHes.
        (st, h, _), target = patch("big.bin", len(data), 0, data[:RAW_MIN + 1], expect=True)
        assert (st, h["upload-offset"]) == (204, str(RAW_MIN + 1))
        assert os.listdir(folder) == []
        st, h, _ = _raw_http(cport, f"HEAD {target} HTTP/1.1\r\nHost: x\r\n"
                                    "Tus-Resumable: 1.0.0\r\n\r\n")
        assert (st, h["upload-offset"]) == (200, str(RAW_MIN + 1))
        head = (f"PATCH {target} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
                f"Upload-Offset: {RAW_MIN + 1}\r\nContent-Type: application/offset+octet-stream"
                f"\r\nContent-Length: {len(data) - RAW_MIN - 1}\r\n\r\n")
        st, h, _ = _raw_http(cport, head, data[RAW_MIN + 1:])
        assert (st, h["upload-offset"]) == (204, str(len(data)))
        with open(os.path.join(folder, "big.bin"), "rb") as fh:
            assert fh.read() == data
        # Downloads by sendfile: whole, and a range of more than RAW_MIN.
        dl = "/download?token=" + tokens.sign(download_claims("volume1", scope, fid, "big.bin"))
        st, h, body = _raw_http(cport, f"GET {dl} HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (st, body, h["accept-ranges"]) == (200, data, "bytes")
        st, h, body = _raw_http(cport, f"GET {dl} HTTP/1.1\r\nHost: x\r\n"
                                       f"Range: bytes=3-{RAW_MIN + 9}\r\n\r\n")
        assert (st, body) == (206, data[3:RAW_MIN + 10])
        assert h["content-range"] == f"bytes 3-{RAW_MIN + 9}/{len(data)}"
        # Past the quota while writing (3 * RAW_MIN, big.bin holds 2 * RAW_MIN + 5):
        # refused with a readable answer, nothing left behind.
        (st, h, body), _ = patch("over.bin", 2 * RAW_MIN, 0, os.urandom(2 * RAW_MIN))
        assert st == 413 and "over.bin" in json.loads(body)["title"], body
        assert sorted(os.listdir(folder)) == ["big.bin"]
        assert [n for n in os.listdir(staging) if not n.endswith(".done")] == []
        # A small body longer than what the upload has left is refused whole.
        (st, _, _), target = patch("short.bin", 10, 0, b"01234")
        assert st == 204
        head = (f"PATCH {target} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
                "Upload-Offset: 5\r\nContent-Type: application/offset+octet-stream\r\n"
                "Content-Length: 8\r\n\r\n")
        st, _, body = _raw_http(cport, head, b"56789abc")
        assert st == 400 and "more bytes" in json.loads(body)["title"], body
        assert "short.bin" not in os.listdir(folder)
        # Tokens in the URL never reach the daemon's log.
        assert "token=" not in d.tail()
    finally:
        d.stop()
