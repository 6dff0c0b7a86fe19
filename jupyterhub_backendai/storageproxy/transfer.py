"""Transfers as Backend.AI does them: straight to the storage proxy, with a token.

The manager (``POST /folders/<ref>/request-upload`` / ``request-download`` of the
Backend.AI client API, :mod:`...api.compat`) checks who may do what, then answers a
URL on the storage proxy and a short-lived token signed with a secret the manager
and the proxy share (:class:`TransferTokens`). The token names one file of one
folder, the operation and, for an upload, the size and an upload id. The proxy
checks only the token:

``/upload?token=...`` speaks **tus 1.0.0** (core protocol + the ``creation``
extension): ``OPTIONS`` (discovery), ``POST`` (creation, ``Upload-Length`` must be the
token's size; ``Location`` is the same URL), ``HEAD`` (``Upload-Offset``, to resume)
and ``PATCH`` (``application/offset+octet-stream`` at ``Upload-Offset``). Backend.AI's
own client skips creation and PATCHes the URL at once, which is also accepted. The
bytes go to ``<quota scope>/.tus/<upload id>`` on the folder's volume, so they count
against the quota scope while they are written; every write checks the scope's
limit (a write past it ends the upload: the partial file is removed, 413), and
the file appears in the folder only when its last byte arrived, by one
``rename``. Unfinished uploads are removed ``upload_idle`` seconds after their last
write.

A token *starts* a transfer only within its ``ttl`` (minutes); past it, it still
carries a transfer under way: the PATCHes and HEADs of a tus upload whose staged file
was written within ``upload_idle``, and the Range requests that resume a download of
the same token that answered within DOWNLOAD_RESUME seconds. Every request, either
way, is refused once the token's grant has ended.

``/download?token=...`` answers the file with ``Content-Length``,
``Last-Modified`` and ``Accept-Ranges``; ``Range: bytes=a-b`` (one range) gives
206, honoured with ``If-Range`` only while the file is unchanged.

The handlers serve the in-hub proxy (routes under the hub's API prefix, see
:mod:`...api.compat.handlers`) and the ``backendai-storage-proxy`` daemon alike.

The code, by concern: :mod:`.tokens` (signing and checking), :mod:`.grants` (whether
a token's access still holds; the daemon's :class:`HubGrants`), :mod:`.transferhandler`
(the handlers' base), :mod:`.tus` (uploads), :mod:`.download`, :mod:`.rawio` (big
transfers on taken-over connections). This module gives the routes, and the names
the hub and the daemon use.
"""

from __future__ import annotations

from .download import DownloadHandler
from .grants import HubGrants
from .rawio import RAW_BUF, RAW_MIN
from .tokens import EXPIRED, TransferTokens, download_claims, expired, upload_claims
from .transferhandler import TUS_VERSION, TransferHandler, log_request
from .tus import TusUploadHandler

__all__ = [
    "EXPIRED", "RAW_BUF", "RAW_MIN", "TUS_VERSION", "DownloadHandler", "HubGrants",
    "TransferHandler", "TransferTokens", "TusUploadHandler", "download_claims", "expired",
    "log_request", "routes", "upload_claims",
]


def routes(prefix: str, volume, grants=None) -> list[tuple]:
    """The two routes under ``prefix``; ``volume``: (handler, name) -> :class:`VFSVolume`;
    ``grants``: see :class:`TransferHandler`."""
    kw = {"volume": volume, "grants": grants}
    return [
        (prefix + "/upload", TusUploadHandler, kw),
        (prefix + "/download", DownloadHandler, kw),
    ]
