"""SSH/SFTP into a session (issue 12, non-HTTP ports): the user's session key.

The key is derived from the keypair a session runs under, never stored: its Ed25519
seed is HMAC-SHA256(the keypair's secret key, :data:`LABEL`), so the keypair's owner
can recompute it from the secret key alone, and a new secret key (a new keypair) gives
a new SSH key. Its public key goes into the session's main kernel
(``/home/config/ssh/authorized_keys``, beside a cluster session's own key); the private
key is handed out only to the session's owner (``GET /sessions/{id}/ssh-key``).
The key lives as long as the access it came from: once the keypair is inactive or
deleted, or its user is not active, the lifecycle's ``SSHWithdrawal`` takes it out of
the running sessions' kernels (issue 22) and new sessions do not get it.
"""

from __future__ import annotations

import hashlib
import hmac

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

LABEL = b"backendai-session-ssh-v1"
# The kernel's sshd (images/kernel/backendai-sshd.conf) and the one user it logs in.
SSH_CONTAINER_PORT = 2200
SSH_USER = "work"


def _key(secret_key: str) -> Ed25519PrivateKey:
    seed = hmac.new(secret_key.encode(), LABEL, hashlib.sha256).digest()
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key(secret_key: str, access_key: str) -> str:
    """The OpenSSH public key line (comment: the access key) for authorized_keys."""
    pub = _key(secret_key).public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{pub} backendai-{access_key}\n"


def private_key(secret_key: str) -> str:
    """The private key in OpenSSH format (what ``ssh -i`` reads), unencrypted."""
    return _key(secret_key).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()).decode()


def session_public_key(db, sess, resource_groups) -> str | None:
    """The public key a session's main kernel authorizes: None unless the session's
    resource group is one of ``resource_groups`` (opt-in), its keypair exists and is
    active, and its user is active (issue 22: a key already placed in a running kernel
    is withdrawn when that stops being so, lifecycle ``SSHWithdrawal``)."""
    from ..common.types import UserStatus
    from ..models import Keypair, User

    if sess.resource_group not in set(resource_groups or ()):
        return None
    kp = db.get(Keypair, sess.access_key)
    user = db.get(User, sess.user_id)
    if kp is None or not kp.is_active or user is None or user.status != UserStatus.ACTIVE:
        return None
    return public_key(kp.secret_key, kp.access_key)
