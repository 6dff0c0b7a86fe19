"""Backend.AI's own client API, spoken by the hub (see docs/backendai-compat.md).

The official ``backend.ai`` CLI and SDK (``backend.ai-client`` 23.09) talk to

    BACKEND_ENDPOINT=<hub URL>/hub/api/backendai

the same prefix as the hub's admin API: Backend.AI's routes (``GET /``,
``/manager/announcement``, ``/session``, ``/folders``, ``/admin/gql``) do not
collide with ours (``/sessions``, ``/vfolders``, ...). Requests are signed with a
keypair exactly as for the admin API (:mod:`..keypair_auth`), and every operation
goes through the same services (:mod:`...manager.admin`, :mod:`...manager.vfolders`,
the manager's ``enqueue``/``destroy_session``), so the access rules are the same.
"""

from __future__ import annotations

SEG = r"([^/]+)"


def routes() -> list[tuple]:
    """(pattern, handler[, kwargs]) relative to the hub prefix, before the API's 404 catch-all.
    The one table of Backend.AI's routes: it imports the handlers (they do not import it)."""
    from ...storageproxy import transfer
    from .. import spec
    from . import folders as f
    from . import handlers as h
    from . import sessions as s
    from . import templates as t
    from .appproxy import AppsHandler, TCPProxyHandler
    from .etcdconfig import EtcdConfigHandler
    from .execute import ExecuteHandler, SessionUploadHandler
    from .images import BackgroundTaskEventsHandler, SessionCommitHandler
    from .sessionfiles import SessionDownloadHandler, SessionFilesHandler

    base = spec.PREFIX.removeprefix("/hub")
    table = [
        ("/?", h.RootHandler),
        ("/manager/announcement", h.AnnouncementHandler),
        ("/admin/gql", h.GQLHandler),
        ("/session", s.SessionCreateHandler),
        # (before /session/{SEG}/...: "_" is no session)
        ("/session/_/logs", h.RefusedHandler, {"what": "task-logs"}),
        ("/session/_/create-from-template", t.CreateFromTemplateHandler),
        ("/template/session", t.TemplatesHandler),
        (f"/template/session/{SEG}", t.TemplateHandler),
        ("/user-config/dotfiles", t.DotfilesHandler, {"scope": "user"}),
        ("/group-config/dotfiles", t.DotfilesHandler, {"scope": "group"}),
        ("/domain-config/dotfiles", t.DotfilesHandler, {"scope": "domain"}),
        (f"/session/{SEG}", s.SessionHandler),
        (f"/session/{SEG}/logs", s.SessionLogsHandler),
        (f"/session/{SEG}/status-history", s.SessionStatusHistoryHandler),
        (f"/session/{SEG}/rename", s.SessionRenameHandler),
        ("/events/session", s.SessionEventsHandler),
        ("/events/background-task", BackgroundTaskEventsHandler),  # issue 25: rescans
        # issue 25: `admin etcd get/set/delete` of config/docker/registry/... only
        ("/config/get", EtcdConfigHandler, {"action": "get"}),
        ("/config/set", EtcdConfigHandler, {"action": "set"}),
        ("/config/delete", EtcdConfigHandler, {"action": "delete"}),
        (f"/session/{SEG}/upload", SessionUploadHandler),
        ("/config/resource-slots", h.ResourceSlotsHandler),
        ("/config/vfolder-types", h.VFolderTypesHandler),
        ("/scaling-groups", h.ScalingGroupsHandler),
        ("/folders", f.FoldersHandler),
        ("/folders/_/allowed_types", h.VFolderTypesHandler),
        ("/folders/_/hosts", f.FolderHostsHandler),
        ("/folders/_/id", f.FolderIdHandler),
        ("/folders/invitations/list", f.InvitationsHandler, {"action": "list"}),
        ("/folders/invitations/accept", f.InvitationsHandler, {"action": "accept"}),
        ("/folders/invitations/delete", f.InvitationsHandler, {"action": "delete"}),
        ("/folders/restore-from-trash-bin", f.FolderTrashHandler, {"action": "restore"}),
        ("/folders/purge", f.FolderTrashHandler, {"action": "purge"}),
        ("/folders/delete-from-trash-bin", f.FolderTrashHandler, {"action": "purge"}),
        (f"/folders/{SEG}", f.FolderHandler),
        (f"/folders/{SEG}/files", f.FolderFilesHandler),
        (f"/folders/{SEG}/mkdir", f.FolderMkdirHandler),
        (f"/folders/{SEG}/rename", f.FolderRenameHandler),
        (f"/folders/{SEG}/clone", f.FolderCloneHandler),
        (f"/folders/{SEG}/rename-file", f.FolderRenameFileHandler),
        (f"/folders/{SEG}/move-file", f.FolderMoveFileHandler),
        (f"/folders/{SEG}/update-options", f.FolderUpdateOptionsHandler),
        (f"/folders/{SEG}/invite", f.FolderInviteHandler),
        (f"/folders/{SEG}/share", f.FolderShareHandler),
        (f"/folders/{SEG}/unshare", f.FolderUnshareHandler),
        (f"/folders/{SEG}/leave", f.FolderLeaveHandler),
        (f"/folders/{SEG}/delete-files", f.FolderDeleteFilesHandler),
        (f"/folders/{SEG}/request-upload", f.FolderRequestUploadHandler),
        (f"/folders/{SEG}/request-download", f.FolderRequestDownloadHandler),
        (f"/stream/session/{SEG}/execute", ExecuteHandler),
        (f"/stream/session/{SEG}/apps", AppsHandler),
        (f"/stream/session/{SEG}/tcpproxy", TCPProxyHandler),
        (f"/session/{SEG}/download", SessionDownloadHandler),
        (f"/session/{SEG}/files", SessionFilesHandler),
        (f"/session/{SEG}/commit", SessionCommitHandler),  # issue 27
        (f"/session/{SEG}/imagify", SessionCommitHandler),
    ]
    # What the clients call and this hub does not offer: a 400 naming what to use instead.
    refused = [
        (f"/stream/session/{SEG}/httpproxy", "app-proxy"),
        (f"/stream/session/{SEG}/pty", "pty"),
        (f"/session/{SEG}/download_single", "session-files"),
        (f"/session/{SEG}/interrupt", "interrupt"),
        (f"/session/{SEG}/complete", "complete"),
        (f"/session/{SEG}/start-service", "start-service"),
        (f"/session/{SEG}/abusing-report", "abusing-report"),
        (f"/session/{SEG}/dependency-graph", "dependency-graph"),
        ("/logs/error", "server-logs"),
        ("/manager/status", "manager"), ("/manager/scheduler/operation", "manager"),
        ("/license", "license"),
        ("/resource/watcher", "watcher"), (f"/resource/watcher/agent/{SEG}", "watcher"),
        ("/resource/usage/month", "usage"), ("/resource/usage/period", "usage"),
        ("/resource/stats/user/month", "usage"), ("/resource/stats/admin/month", "usage"),
        ("/resource/recalculate-usage", "usage"),
        ("/resource/presets", "presets"), ("/resource/check-presets", "presets"),
        ("/config/docker-registries", "registries"),
        ("/resource/container-registries", "registries"),
        ("/folders/_/mounts", "admin-vfolder"), ("/folders/_/fstab", "admin-vfolder"),
        ("/folders/_/perf-metric", "admin-vfolder"), ("/folders/_/shared", "admin-vfolder"),
        ("/folders/_/change-ownership", "admin-vfolder"),
        ("/folders/_/all_hosts", "admin-vfolder"),
        ("/services", "services"), (f"/services/{SEG}", "services"),
        (f"/services/{SEG}/{SEG}", "services"), (f"/services/{SEG}/routings/{SEG}", "services"),
        ("/image/import", "image-import"),
        ("/auth/update-password", "password"), ("/auth/update-password-no-auth", "password"),
        ("/server/update-password-no-auth", "password"),
        ("/server/login", "login"), ("/server/logout", "login"), ("/auth/authorize", "login"),
    ]
    # (first: "/folders/_/mounts" is no folder "_")
    table = [(path, h.RefusedHandler, {"what": what}) for path, what in refused] + table
    table += transfer.routes("/storage", f._local_volume, f._local_grants)
    table.append(("/storage/grant", f.TransferGrantHandler))
    return [(base + row[0], *row[1:]) for row in table]
