"""Kernels as local processes, for machines without a container engine (Binder).

NOT ISOLATED: kernels see the machine's files and network and get no CPU or
memory limits. An agent that runs as root runs them as an unprivileged user
(``run_as``, the Agent's ``local_kernel_user``, uid 1000 by default: the kernel
image's user and the owner of vfolders), never as root, so they cannot read the
hub's private state (its databases and secrets, mode 0600 in a 0700 directory);
the kernel user must be able to enter the working and mounted folders, else the
kernel is refused with the reason. An agent that is not root runs them as its own
user (Binder): they can read whatever that user can. Use it for demos and single-user
machines only. Each user gets a working directory ``<work_root>/<username>``
that stands in for ``/home/work``; a folder mounted at ``/home/work`` itself (the
user's home folder) is the working directory instead.

Vfolders (``spec["mounts"]``) become symbolic links ``<working directory>/<name>``
to the folder on the volume, made when a kernel starts and removed when the last
live kernel of that user that mounts it ends. Read-only (``ro``) cannot be
enforced here: a link gives the kernel's process whatever the OS user may do in
the folder, which is everything, since every kernel runs as the agent's user.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import stat
import sys

from ...common.errors import AgentError, ImageNotFound, InvalidRequest, KernelCannotStart
from ...common.tasks import wait_set
from .base import BATCH, INTERACTIVE, Backend, ExitCallback, ImageInfo, KernelRecord, tail_text

log = logging.getLogger(__name__)

LOCAL_IMAGE = "local/python"


def _default_cmd() -> list[str]:
    """The session's Jupyter server: this environment's ``backendai-singleuser``
    (``jupyterhub-singleuser`` without jsonschema's slow optional ``iri`` checker:
    singleusermain.py), or its ``jupyterhub-singleuser`` where the platform's scripts are
    not installed beside the interpreter."""
    here = os.path.dirname(sys.executable)
    for name in ("backendai-singleuser", "jupyterhub-singleuser"):
        exe = shutil.which(name, path=here)
        if exe:
            return [exe]
    return ["jupyterhub-singleuser"]


class LocalBackend(Backend):
    name = "local"

    def __init__(
        self,
        agent_id: str,
        *,
        state_dir: str,
        work_root: str,
        cmd: list[str] | None = None,
        bind_host: str = "127.0.0.1",
        image_name: str = LOCAL_IMAGE,
        run_as: tuple[int, int] | None = None,
    ):
        # (uid, gid) that kernels run as (no supplementary groups); None: the agent's own.
        self.run_as = run_as
        self.agent_id = agent_id
        self.state_dir = os.path.join(state_dir, "local-kernels")
        self.work_root = work_root
        self.cmd = cmd or _default_cmd()
        self.bind_host = bind_host
        self.image = ImageInfo(
            name=image_name,
            labels={
                "ai.backend.kernelspec": "1",
                "ai.backend.service-ports": "jupyter:http:8888",
                "ai.backend.runtime-type": "python",
            },
        )
        # Batch commands run through bash where the machine has it, as in the kernel image.
        self.shell = shutil.which("bash") or "/bin/sh"
        self._on_exit: ExitCallback | None = None
        self._watchers: dict[str, asyncio.Task] = {}
        # Set once a watched kernel's end is in its state file (with its exit code).
        self._recorded: dict[str, asyncio.Event] = {}

    async def init(self, on_exit: ExitCallback) -> None:
        os.makedirs(self.state_dir, exist_ok=True)
        os.makedirs(self.work_root, exist_ok=True)
        self._on_exit = on_exit
        problem = self.server_problem()
        if problem:  # said once at start, and again with each refused kernel
            log.warning("%s", problem)
        for rec in await self.list_kernels():
            if rec.alive:
                self._recorded[rec.kernel_id] = asyncio.Event()
                self._watchers[rec.kernel_id] = asyncio.create_task(
                    self._watch_pid(rec.kernel_id, int(rec.container_id))
                )

    async def close(self) -> None:
        for t in self._watchers.values():
            t.cancel()
        self._watchers.clear()
        self._recorded.clear()

    async def list_images(self) -> list[ImageInfo]:
        return [self.image]

    async def inspect_image(self, name: str) -> ImageInfo:
        if name != self.image.name:
            raise ImageNotFound(
                f"image {name!r} is not available on this agent (local backend offers {self.image.name!r})"
            )
        return self.image

    def server_problem(self) -> str | None:
        """Why the kernel user cannot start a Jupyter server here (the command, or the
        interpreter its script names, lies where that user cannot go: a hub installed
        under /root, started as root), with what to do; None when it can."""
        if not self.run_as:
            return None
        why = cannot_run(self.cmd[0], *self.run_as)
        if not why:
            return None
        uid = self.run_as[0]
        return (f"local backend: kernels run as uid {uid} (Agent.local_kernel_user), which "
                f"cannot start {self.cmd[0]}: {why}. Install the platform into a Python "
                f"environment uid {uid} can reach and run the hub from there (for example "
                f"`/usr/bin/python3 -m venv /opt/backendai`, `/opt/backendai/bin/pip install "
                f"'.[local]'` in the checkout, then `/opt/backendai/bin/backendai-hub`), or "
                f"use the Docker backend")

    def _state_path(self, kernel_id: str) -> str:
        return os.path.join(self.state_dir, f"{kernel_id}.json")

    async def create_kernel(self, spec, image, host_ports, cuda_devices, fake_devices):
        owner = spec.get("owner") or "user"
        kernel_type = spec.get("kernel_type", INTERACTIVE)
        if spec.get("container_uid") is not None or spec.get("container_main_gid") is not None \
                or spec.get("container_gids"):
            raise KernelCannotStart("local backend: kernels run as one local user "
                             "(Agent.local_kernel_user); a user's container ids "
                             "(container_uid, container_main_gid, container_gids) need the "
                             "Docker backend")
        mounts = list(spec.get("mounts") or [])
        # A folder mounted at /home/work itself (the user's home folder) is the working
        # directory; the other folders are linked into it.
        home = next((m for m in mounts if m["target"] == "/home/work"), None)
        workdir = home["source"] if home else os.path.join(self.work_root, owner)
        mounts = [m for m in mounts if m is not home]
        os.makedirs(workdir, exist_ok=True)
        if self.run_as:
            if not home:  # the working folder of its own: the kernel user's, private
                os.chown(workdir, *self.run_as)
                os.chmod(workdir, 0o700)
            for path in [workdir, *(m["source"] for m in mounts)]:
                blocked = unreachable(path, *self.run_as)
                if blocked:
                    raise KernelCannotStart(
                        f"local backend: kernels run as uid {self.run_as[0]} "
                        f"(Agent.local_kernel_user), which cannot enter {blocked} on the way "
                        f"to {path}. Let it search that directory (chmod o+x, or group "
                        f"{self.run_as[1]}), or keep the working folders "
                        f"(Agent.local_work_root) and volumes where it can.")
        for d in spec.get("dotfiles") or ():  # issue 27 (paths checked by the manager)
            target = os.path.join(workdir, *d["path"].split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as fh:
                fh.write(d["data"])
            os.chmod(target, int(d["permission"], 8))
            if self.run_as:
                os.chown(target, *self.run_as)
        made = self._link_mounts(spec["kernel_id"], owner, workdir, mounts)
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}
        env.update(spec.get("environ") or {})
        env["HOME"] = workdir
        env["SHELL"] = self.shell
        uuids = list(spec.get("cuda_uuids") or [])  # gpu-topology: devices by UUID
        if cuda_devices or uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids) or ",".join(map(str, cuda_devices))
            env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
            env["BACKENDAI_CUDA_DEVICES"] = ",".join(str(i) for i in cuda_devices)
        if kernel_type == INTERACTIVE:
            problem = self.server_problem()
            if problem:
                raise KernelCannotStart(problem)
            port = host_ports[0]
            env["JUPYTERHUB_SERVICE_URL"] = f"http://{self.bind_host}:{port}{spec['service_prefix']}"
            cmd = list(self.cmd)
            if os.geteuid() == 0 and not self.run_as:
                cmd.append("--allow-root")
            cmd.append(f"--ServerApp.root_dir={workdir}")
        elif kernel_type == BATCH:
            cmd = [self.shell, "-c", spec["command"]]
        else:
            cmd = ["sleep", "infinity"]
        logf = open(self._log_path(spec["kernel_id"]), "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                env=env,
                cwd=workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,  # survives a hub restart; killed as a group
                **(
                    {"user": self.run_as[0], "group": self.run_as[1], "extra_groups": []}
                    if self.run_as else {}
                ),
            )
        except OSError as e:
            self._unlink(made)
            raise AgentError(f"could not start the kernel process: {e}") from None
        except BaseException:
            self._unlink(made)
            raise
        finally:
            logf.close()
        ports = []
        if kernel_type == INTERACTIVE:
            for i, sp in enumerate(image.service_ports):
                sp.host_port = host_ports[i] if i < len(host_ports) else None
                ports.append(sp.to_json())
        rec = KernelRecord(
            kernel_id=spec["kernel_id"],
            session_id=spec["session_id"],
            container_id=str(proc.pid),
            host=self.bind_host,
            service_ports=ports,
            cuda_devices=list(cuda_devices),
            kernel_type=kernel_type,
            cuda_uuids=uuids,
        )
        tmp = self._state_path(rec.kernel_id) + ".tmp"
        with open(tmp, "w") as f:
            json.dump({**rec.to_json(), "owner": owner, "mounts": mounts, "workdir": workdir}, f)
        os.replace(tmp, self._state_path(rec.kernel_id))
        self._recorded[rec.kernel_id] = asyncio.Event()
        self._watchers[rec.kernel_id] = asyncio.create_task(self._watch_proc(rec.kernel_id, proc))
        return rec

    # -- vfolders as links ------------------------------------------------------

    def _states(self) -> dict[str, dict]:
        """The state of every kernel this backend runs, by kernel id."""
        out = {}
        for fn in sorted(os.listdir(self.state_dir)):
            if not fn.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.state_dir, fn)) as f:
                    out[fn[: -len(".json")]] = json.load(f)
            except (OSError, ValueError):
                continue
        return out

    def _links_in_use(self, owner: str, exclude: str) -> dict[str, str]:
        """link path -> source of the mounts of ``owner``'s other live kernels."""
        used = {}
        for kid, data in self._states().items():
            if kid == exclude or data.get("owner") != owner:
                continue
            workdir = data.get("workdir") or os.path.join(self.work_root, owner)
            for m in data.get("mounts") or []:
                used[os.path.join(workdir, os.path.basename(m["target"]))] = m["source"]
        return used

    def _link_mounts(self, kernel_id: str, owner: str, workdir: str, mounts: list[dict]) -> list[str]:
        """Make ``<workdir>/<name>`` -> source for each mount; returns the links made
        (a link that another kernel of the owner already made to the same folder is
        shared). All or none: on a conflict the links made so far are removed."""
        used = self._links_in_use(owner, kernel_id)
        made: list[str] = []
        try:
            for m in mounts:
                name = os.path.basename(m["target"])
                link = os.path.join(workdir, name)
                if os.path.islink(link):
                    if os.readlink(link) == m["source"]:
                        continue
                    if link in used:
                        raise InvalidRequest(
                            f"cannot mount {name!r}: another session of {owner} has a different "
                            f"folder at {m['target']}")
                    os.unlink(link)  # left by a kernel that is gone
                elif os.path.lexists(link):
                    raise InvalidRequest(
                        f"cannot mount {name!r}: {owner}'s working folder already has a file or "
                        f"folder of that name")
                os.symlink(m["source"], link, target_is_directory=True)
                made.append(link)
        except BaseException:
            self._unlink(made)
            raise
        return made

    @staticmethod
    def _unlink(links: list[str]) -> None:
        for link in links:
            try:
                if os.path.islink(link):
                    os.unlink(link)
            except FileNotFoundError:
                pass

    def _forget(self, kernel_id: str, exit_code: int | None = None, *, ended: bool = False) -> None:
        """Drop a kernel's state (``ended``: keep it, marked ended with ``exit_code`` and
        no mounts, until the kernel is removed); remove its links unless another live
        kernel of the same owner mounts the same folder."""
        path = self._state_path(kernel_id)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            if ended:
                return  # removed meanwhile (destroy_kernel): nothing to mark
            data = {}
        if ended:
            with open(path + ".tmp", "w") as f:
                json.dump({**data, "exited": True, "exit_code": exit_code, "mounts": []}, f)
            os.replace(path + ".tmp", path)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        owner = data.get("owner")
        if not owner or not data.get("mounts"):
            return
        used = self._links_in_use(owner, kernel_id)
        workdir = data.get("workdir") or os.path.join(self.work_root, owner)
        for m in data["mounts"]:
            link = os.path.join(workdir, os.path.basename(m["target"]))
            if used.get(link) == m["source"]:
                continue
            try:
                if os.path.islink(link) and os.readlink(link) == m["source"]:
                    os.unlink(link)
            except FileNotFoundError:
                pass

    def _log_path(self, kernel_id: str) -> str:
        return os.path.join(self.state_dir, f"{kernel_id}.log")

    async def kernel_logs(self, kernel_id: str, limit: int) -> str | None:
        try:
            with open(self._log_path(kernel_id), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(f.tell() - limit, 0))
                return tail_text(f.read(), limit)
        except FileNotFoundError:
            return None

    async def _watch_proc(self, kernel_id: str, proc) -> None:
        code = await proc.wait()
        await self._exited(kernel_id, code)

    async def _watch_pid(self, kernel_id: str, pid: int) -> None:
        while _pid_alive(pid):
            await asyncio.sleep(1)
        await self._exited(kernel_id, None)

    async def _exited(self, kernel_id: str, code: int | None) -> None:
        self._watchers.pop(kernel_id, None)
        recorded = self._recorded.pop(kernel_id, None)
        # Keep the record, marked ended with its code, until the manager removes the
        # kernel (as an exited container stays listed): a reconciliation that runs before
        # the exit event is handled then sees how it ended, not a kernel gone missing.
        # Its folders' links go now.
        self._forget(kernel_id, code, ended=True)
        if recorded:
            recorded.set()
        if self._on_exit:
            await self._on_exit(kernel_id, code)

    async def destroy_kernel(self, kernel_id: str) -> None:
        try:
            with open(self._state_path(kernel_id)) as f:
                data = json.load(f)
        except FileNotFoundError:
            self._remove_log(kernel_id)
            return
        pid = int(data["container_id"])
        # An ended kernel's pid may belong to another process by now: signal none.
        for sig, wait in () if data.get("exited") else ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            for _ in range(int(wait * 20)):
                if not _pid_alive(pid):
                    break
                await asyncio.sleep(0.05)
            else:
                continue
            break
        watcher = self._watchers.get(kernel_id)
        if watcher:
            try:
                async with asyncio.timeout(3):
                    await asyncio.shield(watcher)
            except (TimeoutError, asyncio.CancelledError):
                pass
        self._forget(kernel_id)
        self._remove_log(kernel_id)

    def _remove_log(self, kernel_id: str) -> None:
        try:
            os.unlink(self._log_path(kernel_id))
        except FileNotFoundError:
            pass

    async def _settled_record(self, path: str) -> dict:
        """A kernel's state file; for a process that has ended but whose watcher has not
        yet recorded how (the window between its exit and ``proc.wait()`` returning, wide
        on a busy machine), after that watcher has: a list never shows an ended kernel
        without its exit code, which a reconciliation would take for a lost kernel."""
        with open(path) as f:
            data = json.load(f)
        recorded = self._recorded.get(data.get("kernel_id", ""))
        if recorded and not data.get("exited") and not _pid_alive(int(data["container_id"])):
            if not await wait_set(recorded, 5):
                return data
            with open(path) as f:
                data = json.load(f)
        return data

    async def kernel_stats(self) -> dict[str, dict]:
        """Each live kernel's usage: the processes of its session (each kernel leads one:
        ``start_new_session``) summed from /proc, CPU time and resident memory; no limit."""
        leaders = {}
        for kid, data in self._states().items():
            if not data.get("exited"):
                leaders[int(data["container_id"])] = kid
        return await asyncio.to_thread(_session_usage, leaders) if leaders else {}

    async def list_kernels(self) -> list[KernelRecord]:
        out = []
        for fn in sorted(os.listdir(self.state_dir)):
            if not fn.endswith(".json"):
                continue
            try:
                data = await self._settled_record(os.path.join(self.state_dir, fn))
            except (OSError, ValueError):
                continue
            data.pop("owner", None)
            data.pop("mounts", None)
            data.pop("workdir", None)
            data["alive"] = not data.pop("exited", False) and _pid_alive(int(data["container_id"]))
            out.append(KernelRecord(**data))
        return out


def unreachable(path: str, uid: int, gid: int) -> str | None:
    """The first directory from ``/`` to ``path`` (itself included) that ``uid:gid``
    (no other groups) may not enter; None when it reaches ``path``."""
    cur = "/"
    for part in [""] + os.path.abspath(path).strip("/").split("/"):
        cur = os.path.join(cur, part) if part else cur
        try:
            st = os.stat(cur)
        except OSError:
            return cur
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if uid != 0 and not st.st_mode & bit:
            return cur
    return None


def _may(st: os.stat_result, uid: int, gid: int, bits: tuple[int, int, int]) -> bool:
    """Whether ``uid:gid`` (no other groups) has the owner/group/other ``bits`` on ``st``."""
    if uid == 0:
        return True
    bit = bits[0] if st.st_uid == uid else bits[1] if st.st_gid == gid else bits[2]
    return bool(st.st_mode & bit)


def _link_chain(path: str) -> list[str]:
    """``path`` and each symbolic link's target after it, up to the file itself."""
    chain = [os.path.abspath(path)]
    while os.path.islink(chain[-1]) and len(chain) < 40:
        target = os.readlink(chain[-1])
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), target)))
    real = os.path.realpath(path)
    return chain if real in chain else [*chain, real]


def cannot_run(command: str, uid: int, gid: int) -> str | None:
    """Why ``uid:gid`` could not execute ``command`` (found on PATH when it is a bare
    name), following symbolic links and a script's ``#!`` interpreter; None when it
    can. Checked before a kernel starts, because exec's own error names only the
    script ("Permission denied: .../bin/jupyterhub-singleuser") when it is the
    interpreter behind it that lies out of reach."""
    path = command if os.sep in command else shutil.which(command)
    if not path:
        return f"{command} is not on PATH"
    seen: list[str] = []
    for _ in range(8):  # the command, then its interpreter (and that one's, if a script)
        what = "it" if not seen else f"its interpreter {path}"
        for p in _link_chain(path):  # exec resolves each link as that user
            blocked = unreachable(os.path.dirname(p), uid, gid)
            if blocked:
                return (f"{what} lies under {blocked}, which that user cannot enter"
                        + (f" ({p})" if p != path else ""))
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError as e:
            return f"{what} cannot be read: {e.strerror}"
        if not _may(st, uid, gid, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
            return f"{what} ({real}) is not executable by that user"
        seen.append(real)
        try:
            with open(real, "rb") as f:
                head = f.read(256)
        except OSError:
            return None
        if not head.startswith(b"#!"):
            return None
        if not _may(st, uid, gid, (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)):
            return f"{what} ({real}) is a script that user cannot read"
        words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        if not words:
            return None
        path = words[0]
        if os.path.basename(path) == "env" and len(words) > 1:
            found = shutil.which(words[1])
            if not found:
                return None
            path = found
        if os.path.realpath(path) in seen:
            return None
    return None


_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _session_usage(leaders: dict[int, str]) -> dict[str, dict]:
    """{kernel id: {"cpu_ns", "mem_bytes", "mem_limit_bytes": 0}} for the kernels whose
    session leaders' pids are ``leaders`` (pid -> kernel id), over every process of
    their sessions; a kernel whose processes are all gone is left out."""
    out: dict[str, dict] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, session, ..., utime (12), stime (13),
        # ..., rss in pages (22), counted from the state.
        kid = leaders.get(int(fields[3]))
        if kid is None or fields[0] == "Z":
            continue
        k = out.setdefault(kid, {"cpu_ns": 0, "mem_bytes": 0, "mem_limit_bytes": 0})
        k["cpu_ns"] += int((int(fields[11]) + int(fields[12])) * _TICK_NS)
        k["mem_bytes"] += int(fields[21]) * _PAGE
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
