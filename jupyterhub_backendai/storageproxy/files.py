"""The files inside a folder: listing, directories, moves, deletion, uploads, downloads.

Every operation takes a path relative to the folder and reaches it through open
directories, never through a link (:mod:`.paths`). An upload is written to a hidden
temporary file beside its target and renamed over it when whole (:class:`Upload`),
checking the tighter of the folder's and its scope's limits before every write; a
download reads one open file a chunk at a time (:class:`FileChunks`).
:class:`FolderFiles` is a part of :class:`~.volumes.VFSVolume`.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator

from ..common.errors import Conflict, InvalidRequest, NotFound, StorageQuotaExceeded
from .paths import _DIR_FLAGS, FOLDER_MODE, _os_error, _rmtree_fd, split_path

CHUNK_SIZE = 1 << 20


class Upload:
    """One file being written: a hidden temporary file beside the target, renamed
    over it on :meth:`commit`, removed on :meth:`abort` (or any error). Every write
    first checks the quota scope's limit, so the temporary file never exceeds it."""

    def __init__(self, volume: FolderFiles, quota_scope_id: str, parent_fd: int, name: str,
                 path: str, limit: int | None, used: int, bounded: str = ""):
        self.volume = volume
        self.quota_scope_id = quota_scope_id
        # what ``limit`` bounds: the quota scope, or the folder where its own limit is tighter
        self.bounded = bounded or f"quota scope {quota_scope_id}"
        self.path = path
        self.limit = limit
        self.used = used
        self.written = 0
        self._lock = threading.Lock()  # a cancelled caller's write may still run in a thread
        self._parent = parent_fd
        self._name = name
        self._tmp = f".upload-{secrets.token_hex(8)}.tmp"
        self._fd: int | None = os.open(
            self._tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=parent_fd,
        )
        self.done = False
        if os.geteuid() == 0:
            try:
                os.fchown(self._fd, volume.folder_uid, volume.folder_gid)
            except OSError:
                os.close(self._fd)
                os.unlink(self._tmp, dir_fd=parent_fd)
                self.done = True
                raise

    def write(self, data: bytes) -> None:
        with self._lock:
            self._write(data)

    def _write(self, data: bytes) -> None:
        if self.done:
            raise InvalidRequest("the upload is already finished")
        if self.limit is not None and self.used + self.written + len(data) > self.limit:
            self._abort()
            raise StorageQuotaExceeded(
                f"{self.bounded} on volume {self.volume.name} is limited "
                f"to {self.limit} bytes and {self.used} are used; the upload of {self.path!r} "
                f"would need more than the {max(self.limit - self.used, 0)} bytes left"
            )
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
                self.written += n
        except OSError as e:
            self._abort()
            raise _os_error(e, self.path) from None

    def commit(self) -> dict:
        with self._lock:
            return self._commit()

    def _commit(self) -> dict:
        if self.done:
            raise InvalidRequest("the upload is already finished")
        try:
            os.close(self._fd)
            self._fd = None
            os.rename(self._tmp, self._name, src_dir_fd=self._parent, dst_dir_fd=self._parent)
        except OSError as e:
            self._abort()
            raise _os_error(e, self.path) from None
        self.done = True
        os.close(self._parent)
        return {"path": self.path, "size": self.written}

    def abort(self) -> None:
        """Idempotent; leaves the target as it was."""
        with self._lock:
            self._abort()

    def _abort(self) -> None:
        if self.done:
            return
        self.done = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            os.unlink(self._tmp, dir_fd=self._parent)
        except FileNotFoundError:
            pass
        os.close(self._parent)

    def __del__(self):
        if not getattr(self, "done", True):
            self._abort()


class FileChunks:
    """A download: at most ``size`` bytes of one open file, ``CHUNK_SIZE`` at a time
    (the size is the one answered before the first byte; a file that grows meanwhile
    is cut there)."""

    def __init__(self, fd: int, size: int):
        self._fd: int | None = fd
        self.size = size
        self._left = size
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        chunk = self.read()
        if not chunk:
            raise StopIteration
        return chunk

    def read(self) -> bytes:
        """The next chunk, or ``b""`` at the end (the file is then closed)."""
        with self._lock:
            if self._fd is None:
                return b""
            chunk = os.read(self._fd, min(CHUNK_SIZE, self._left)) if self._left else b""
            self._left -= len(chunk)
            if not chunk:
                os.close(self._fd)
                self._fd = None
            return chunk

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None


class FolderFiles:
    """The operations on the files inside a folder. A part of
    :class:`~.volumes.VFSVolume`, whose ``_open_folder``, ``_chown``, ``upload_bound``
    (:class:`~.quotas.VFSQuotas`) and ``name`` they use."""

    def _open_dir(self, quota_scope_id: str, folder_id: str, parts: list[str], shown: str) -> int:
        """Open the directory ``parts`` inside a folder, one component at a time and
        never through a symbolic link."""
        fd = self._open_folder(quota_scope_id, folder_id)
        try:
            for i, part in enumerate(parts):
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    where = "/".join(parts[: i + 1])
                    if e.errno == errno.ENOTDIR or e.errno == errno.ELOOP:
                        try:
                            is_link = stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode)
                        except OSError:
                            is_link = False
                        if is_link:
                            raise InvalidRequest(
                                f"{shown!r}: {where!r} is a symbolic link (links are not followed)"
                            ) from None
                        raise InvalidRequest(f"{shown!r}: {where!r} is not a directory") from None
                    if e.errno == errno.ENOENT:
                        raise NotFound(f"{shown!r}: no directory {where!r} in the folder") from None
                    raise _os_error(e, shown) from None
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _parent(self, quota_scope_id: str, folder_id: str, path: str) -> tuple[int, str, str]:
        """(open parent directory, entry name, normalized path) of a non-root path."""
        parts = split_path(path)
        shown = "/".join(parts)
        return self._open_dir(quota_scope_id, folder_id, parts[:-1], shown), parts[-1], shown

    def list_files(self, quota_scope_id: str, folder_id: str, path: str = "") -> list[dict]:
        """Entries of a directory, by name: {name, type (file, dir, symlink or other),
        size, mtime}; a link's size is that of the link itself."""
        parts = split_path(path, allow_root=True)
        fd = self._open_dir(quota_scope_id, folder_id, parts, "/".join(parts) or ".")
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            out = []
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    kind = "file"
                elif stat.S_ISDIR(st.st_mode):
                    kind = "dir"
                elif stat.S_ISLNK(st.st_mode):
                    kind = "symlink"
                else:
                    kind = "other"
                out.append(
                    {"name": e.name, "type": kind, "size": st.st_size, "mtime": st.st_mtime}
                )
        finally:
            os.close(fd)
        return sorted(out, key=lambda x: x["name"])

    def mkdir(self, quota_scope_id: str, folder_id: str, path: str, parents: bool = False) -> None:
        """Create a directory; with ``parents`` also the missing ones above it, and an
        existing directory is not an error (``mkdir -p``)."""
        parts = split_path(path)
        shown = "/".join(parts)
        if not parents:
            fd, name, _ = self._parent(quota_scope_id, folder_id, path)
            try:
                os.mkdir(name, FOLDER_MODE, dir_fd=fd)
                self._chown(name, fd)
            except OSError as e:
                raise _os_error(e, shown) from None
            finally:
                os.close(fd)
            return
        fd = self._open_folder(quota_scope_id, folder_id)
        try:
            for part in parts:
                try:
                    os.mkdir(part, FOLDER_MODE, dir_fd=fd)
                    self._chown(part, fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise _os_error(e, shown) from None
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ENOTDIR, errno.ELOOP):
                        if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                            raise InvalidRequest(
                                f"{shown!r}: {part!r} is a symbolic link (links are not followed)"
                            ) from None
                        raise Conflict(f"{shown!r}: {part!r} exists and is not a directory") from None
                    raise _os_error(e, shown) from None
                os.close(fd)
                fd = nxt
        finally:
            os.close(fd)

    def rename(self, quota_scope_id: str, folder_id: str, path: str, new_path: str) -> None:
        """Move an entry within the folder; an existing destination is not replaced."""
        src_fd, src, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            dst_fd, dst, new_shown = self._parent(quota_scope_id, folder_id, new_path)
            try:
                try:
                    os.lstat(src, dir_fd=src_fd)
                except OSError as e:
                    raise _os_error(e, shown) from None
                try:
                    os.lstat(dst, dir_fd=dst_fd)
                    raise Conflict(f"{new_shown!r}: already exists")
                except FileNotFoundError:
                    pass
                try:
                    os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except OSError as e:
                    raise _os_error(e, f"{shown} -> {new_shown}") from None
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)

    def delete(self, quota_scope_id: str, folder_id: str, path: str, recursive: bool = False) -> None:
        """Remove a file, a link (not its target) or a directory (an empty one unless
        ``recursive``)."""
        fd, name, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            try:
                st = os.lstat(name, dir_fd=fd)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=fd)
                elif recursive:
                    _rmtree_fd(fd, name)
                else:
                    os.rmdir(name, dir_fd=fd)
            except OSError as e:
                raise _os_error(e, shown) from None
        finally:
            os.close(fd)

    def begin_upload(self, quota_scope_id: str, folder_id: str, path: str) -> Upload:
        """Start writing a file (new, or replacing one: the quota then counts the
        old file's bytes as freed). The caller writes, then commits or aborts."""
        fd, name, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            replaced = 0
            try:
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISDIR(st.st_mode):
                    raise Conflict(f"{shown!r}: is a directory")
                if stat.S_ISREG(st.st_mode):
                    replaced = st.st_size
            except FileNotFoundError:
                pass
            bound = self.upload_bound(quota_scope_id, folder_id, replaced)
            bounded, limit, used = bound or ("", None, 0)
            if bound is not None and used > limit:
                raise StorageQuotaExceeded(
                    f"{bounded} on volume {self.name} is limited to "
                    f"{limit} bytes and {used} are used; delete files before uploading"
                )
            return Upload(self, quota_scope_id, fd, name, shown, limit, used, bounded)
        except OSError as e:
            os.close(fd)
            raise _os_error(e, shown) from None
        except BaseException:
            os.close(fd)
            raise

    def upload(self, quota_scope_id: str, folder_id: str, path: str, chunks: Iterable[bytes]) -> dict:
        """Write a file from ``chunks``: all or nothing ({path, size} once renamed into place)."""
        up = self.begin_upload(quota_scope_id, folder_id, path)
        try:
            for chunk in chunks:
                up.write(chunk)
            return up.commit()
        finally:
            up.abort()

    def download(self, quota_scope_id: str, folder_id: str, path: str) -> tuple[int, FileChunks]:
        """(size, chunks) of a regular file; a directory, link or device is refused."""
        fd, name, shown = self._parent(quota_scope_id, folder_id, path)
        try:
            try:
                f = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError as e:
                if e.errno == errno.EISDIR:
                    raise InvalidRequest(f"{shown!r} is a directory, not a file") from None
                raise _os_error(e, shown) from None
        finally:
            os.close(fd)
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            os.close(f)
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InvalidRequest(f"{shown!r} is {what}; only files can be downloaded")
        os.set_blocking(f, True)
        return st.st_size, FileChunks(f, st.st_size)
