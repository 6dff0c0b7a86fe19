"""Issue 22: withdraw a keypair's SSH key from a running kernel (run INSIDE the kernel).

The Docker backend runs this file's source in the kernel as the kernel's user (``python3
-c``, the access key as its argument), who owns ``/home/config/ssh``, its sshd and what
that started; not as root, which holds no capabilities in a kernel (no DAC override, no
CAP_SYS_PTRACE to look into another user's processes). Stdlib only, nothing of ours.

1. ``/home/config/ssh/authorized_keys`` loses every line that authorizes the key whose
   comment is ``backendai-<access key>`` (the line the agent put there,
   ``_cluster_ssh_archive``), under any comment or options (a copy the user added
   under another name is the same key): a new file beside it (same owner, mode 0600),
   fsynced, renamed over the old one, so sshd never reads half a file.
2. The open connections of the kernel's sshd that no key still authorized accounts for
   are ended: each per-connection sshd (a child of the listening sshd) with everything
   it started. A connection is kept only when what it runs
   says who it is (SSH_CONNECTION: the client's address and port) and the sshd's log
   (``/home/config/ssh/sshd.log``: "Accepted publickey for work from ADDR port PORT
   ssh2: TYPE SHA256:FP") says that it logged in with a key that stays authorized (a
   cluster session's own key, used by its other kernels). Every other connection is
   ended: sftp and tunnels (nothing to read), one still authenticating, one the log
   does not name. The listening sshd stays: the kernel's other keys keep working.

Prints ``{"removed": lines removed, "ended": [pids of the connections ended]}``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import sys

SSH_DIR = "/home/config/ssh"
KEY_TYPES = re.compile(r"^(ssh-|ecdsa-|sk-)")
ACCEPTED = re.compile(r"Accepted publickey for \S+ from (\S+) port (\d+) \S+: \S+ (SHA256:\S+)")


def key_blob(line: str) -> str | None:
    """The base64 key of an authorized_keys line (options, type, key, comment)."""
    fields = line.split()
    for i, f in enumerate(fields[:-1]):
        if KEY_TYPES.match(f):
            return fields[i + 1]
    return None


def fingerprint(blob: str) -> str | None:
    """OpenSSH's SHA256 fingerprint of a base64 key."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        return None
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def withdraw(lines: list[str], comment: str) -> tuple[list[str], int]:
    """``lines`` without those authorizing the key named ``comment``; how many went."""
    withdrawn = {key_blob(ln) for ln in lines if comment in ln.split()} - {None}
    keep = [ln for ln in lines if key_blob(ln) not in withdrawn]
    return keep, len(lines) - len(keep)


def accepted(log_text: str) -> dict[tuple[str, int], str]:
    """(peer address, peer port) -> the fingerprint it logged in with (the last one)."""
    out = {}
    for m in ACCEPTED.finditer(log_text):
        out[(_plain(m.group(1)), int(m.group(2)))] = m.group(3)
    return out


def _plain(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") else addr


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out[int(d)] = (ppid, comm)
    return out


def _peer_of(pid: int) -> tuple[str, int] | None:
    """The client (address, port) of the connection ``pid`` runs in: its SSH_CONNECTION
    (sshd sets it for what a connection starts; the sshd processes themselves are not
    readable, they are not dumpable)."""
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"SSH_CONNECTION="):
            fields = item[15:].decode(errors="replace").split()
            if len(fields) == 4 and fields[1].isdigit():
                return _plain(fields[0]), int(fields[1])
    return None


def end_connections(kept_fingerprints: set[str], log_text: str) -> list[int]:
    """End every per-connection sshd (and what it started) whose login is not one of
    ``kept_fingerprints``; returns their pids."""
    procs = processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)

    def tree(pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    listeners = {pid for pid, (ppid, comm) in procs.items()
                 if comm == "sshd" and procs.get(ppid, (0, ""))[1] != "sshd"}
    logins = accepted(log_text)
    ended = []
    for pid, (ppid, comm) in procs.items():
        if comm != "sshd" or ppid not in listeners:
            continue
        members = tree(pid)
        fps = {logins.get(_peer_of(p)) for p in members}
        fps.discard(None)
        if fps and fps <= kept_fingerprints:
            continue  # logged in with a key that stays (a cluster session's own)
        for p in reversed(members):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        ended.append(pid)
    return ended


def main(access_key: str) -> dict:
    path = os.path.join(SSH_DIR, "authorized_keys")
    try:
        with open(path) as f:
            lines = f.read().splitlines(keepends=True)
        st = os.stat(path)
    except FileNotFoundError:
        lines, st = [], None
    keep, removed = withdraw(lines, f"backendai-{access_key}")
    if removed and st is not None:
        tmp = os.path.join(SSH_DIR, f".authorized_keys.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, "".join(keep).encode())
            os.fchown(fd, st.st_uid, st.st_gid)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    kept = {fingerprint(b) for b in map(key_blob, keep) if b} - {None}
    try:
        with open(os.path.join(SSH_DIR, "sshd.log"), errors="replace") as f:
            log_text = f.read()
    except OSError:
        log_text = ""
    return {"removed": removed, "ended": end_connections(kept, log_text)}


if __name__ == "__main__":
    if len(sys.argv) != 2 or not re.fullmatch(r"[A-Za-z0-9]{1,64}", sys.argv[1]):
        sys.exit("usage: sshrevoke ACCESS_KEY")
    print(json.dumps(main(sys.argv[1])))
