"""The record: tenancy, policies, resource groups, agents, sessions, kernels."""

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
    "project_members",
    "session_dependencies",
]
