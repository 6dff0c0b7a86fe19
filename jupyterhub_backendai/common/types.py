"""Session and kernel states, in the order a session goes through them."""

from __future__ import annotations

import enum


class SessionStatus(enum.StrEnum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"


ALIVE_STATUSES = frozenset(
    {
        SessionStatus.PENDING,
        SessionStatus.SCHEDULED,
        SessionStatus.PREPARING,
        SessionStatus.CREATING,
        SessionStatus.RUNNING,
    }
)
STARTING_STATUSES = frozenset(
    {SessionStatus.SCHEDULED, SessionStatus.PREPARING, SessionStatus.CREATING}
)
DEAD_STATUSES = frozenset(
    {SessionStatus.TERMINATED, SessionStatus.ERROR, SessionStatus.CANCELLED}
)

# Progress (0-100) shown by the spawner for each state.
PROGRESS = {
    SessionStatus.PENDING: 10,
    SessionStatus.SCHEDULED: 30,
    SessionStatus.PREPARING: 45,
    SessionStatus.CREATING: 60,
    SessionStatus.RUNNING: 90,
}


class AgentStatus(enum.StrEnum):
    ALIVE = "ALIVE"
    LOST = "LOST"
    TERMINATED = "TERMINATED"


class UserStatus(enum.StrEnum):
    ACTIVE = "active"
    INACTIVE = "inactive"
    DELETED = "deleted"
    BEFORE_VERIFICATION = "before-verification"


class UserRole(enum.StrEnum):
    SUPERADMIN = "superadmin"
    ADMIN = "admin"
    USER = "user"
    MONITOR = "monitor"


class VFolderPermission(enum.StrEnum):
    """What a user may do in a folder's files (Backend.AI's mount permissions)."""

    READ_ONLY = "ro"
    READ_WRITE = "rw"
    RW_DELETE = "wd"  # read, write and delete


class VFolderOwnership(enum.StrEnum):
    USER = "user"
    PROJECT = "project"


class VFolderStatus(enum.StrEnum):
    PROVISIONING = "provisioning"  # row written, directory not yet confirmed by the storage proxy
    READY = "ready"
    DELETING = "deleting"


# What allowed_vfolder_hosts grants per host, as in Backend.AI: the union over the
# domain, the user's projects (or the folder's project) and the keypair policy decides.
HOST_PERMISSIONS = (
    "create-vfolder",
    "modify-vfolder",
    "delete-vfolder",
    "mount-in-session",
    "upload-file",
    "download-file",
    "invite-others",
    "set-user-specific-permission",
)
