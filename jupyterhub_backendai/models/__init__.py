"""The record: tenancy, policies, resource groups, agents, sessions, kernels, vfolders."""

from .base import Base
from .cluster import Agent, ResourceGroup
from .session import Kernel, Session, session_dependencies
from .tenancy import (
    Domain,
    Keypair,
    KeypairResourcePolicy,
    Project,
    ProjectResourcePolicy,
    User,
    UserResourcePolicy,
    project_members,
)
from .vfolder import VFolder, VFolderPermissionRow

__all__ = [
    "Agent",
    "Base",
    "Domain",
    "Kernel",
    "Keypair",
    "KeypairResourcePolicy",
    "Project",
    "ProjectResourcePolicy",
    "ResourceGroup",
    "Session",
    "User",
    "UserResourcePolicy",
    "VFolder",
    "VFolderPermissionRow",
    "project_members",
    "session_dependencies",
]
