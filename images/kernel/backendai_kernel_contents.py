"""The kernel image's contents manager: Jupyter Server's own, whose directory listing
leaves out an entry renamed or removed while it is listed instead of failing.

Jupyter Server lists a directory by reading its names and then the model of each. When
an entry goes between the two (JupyterLab's "Rename and Save" of a new notebook, a
script deleting its output, a checkpoint moved), the model of that entry raises 404,
and with it the whole listing: JupyterLab's file browser then says "Directory not
found" over the page, for a directory that is there (seen in a browser test under
load, stop 34). Here the listing is the same (the same entries left out: special files,
those ``should_list`` refuses, hidden ones unless allowed), and an entry that is gone
by the time its model is read is left out, as one gone before the names were read.
"""

from __future__ import annotations

import errno
import os
import stat

from anyio.to_thread import run_sync
from jupyter_core.paths import is_file_hidden
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web


class ListingContentsManager(AsyncLargeFileManager):
    """:class:`AsyncLargeFileManager` (Jupyter Server's default) with a directory listing
    that an entry vanishing during it does not fail."""

    async def _dir_model(self, path, content=True):
        # The directory's own checks (exists, not hidden) and model, without entries.
        model = await super()._dir_model(path, content=False)
        if not content:
            return model
        os_dir = self._get_os_path(path)
        entries = []
        for name in await run_sync(os.listdir, os_dir):
            entry = await self._entry_model(path, os_dir, name)
            if entry is not None:
                entries.append(entry)
        model["content"] = entries
        model["format"] = "json"
        return model

    async def _entry_model(self, path: str, os_dir: str, name: str) -> dict | None:
        """The model of one entry of a listing, or None: not listed (gone, special,
        refused by ``should_list``, hidden, or unreadable)."""
        os_path = os.path.join(os_dir, name)
        try:
            st = os.lstat(os_path)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EACCES):
                self.log.warning("Error stat-ing %s: %r", os_path, e)
            return None
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)
                or stat.S_ISDIR(st.st_mode)):
            return None
        try:
            if not self.should_list(name) or (
                    not self.allow_hidden and is_file_hidden(os_path, stat_res=st)):
                return None
            return await self.get(path=f"{path}/{name}", content=False)
        except web.HTTPError as e:
            if e.status_code == 404:
                return None  # gone since its name was read
            raise
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EACCES, errno.ENOENT):
                self.log.warning("Error listing %s: %r", os_path, e)
            return None
