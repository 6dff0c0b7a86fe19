"""The record: tenancy, policies, resource groups, agents, images, sessions, kernels, vfolders."""

from .base import Base
from .cluster import Agent, ResourceGroup
from .images import ContainerRegistry, Image, ImageAlias
from .presets import ResourcePreset
from .session import Kernel, Session, session_dependencies
from .templates import Dotfile, SessionTemplate
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
from .usage import KernelUsage
from .vfolder import VFolder, VFolderPermissionRow
from .warmpool import WarmPool

__all__ = [
    "Agent",
    "Base",
    "ContainerRegistry",
    "Domain",
    "Dotfile",
    "Image",
    "ImageAlias",
    "Kernel",
    "KernelUsage",
    "Keypair",
    "KeypairResourcePolicy",
    "Project",
    "ProjectResourcePolicy",
    "ResourceGroup",
    "ResourcePreset",
    "Session",
    "SessionTemplate",
    "User",
    "UserResourcePolicy",
    "VFolder",
    "VFolderPermissionRow",
    "WarmPool",
    "project_members",
    "session_dependencies",
]
