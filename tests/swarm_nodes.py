"""Two "machines" on one host for multi-node tests and benchmarks (issue 15).

Each node is a network namespace of its own with its own ``dockerd`` (own data root,
exec root, socket, pid file and cgroup parent), started with ``nsenter --net=...``
(``ip netns exec`` would also remount /sys and hide the cgroup hierarchy from dockerd).
The two namespaces are joined by one veth pair with addresses of the test's own
(198.18.<n>.1 and .2, the benchmarking range of RFC 2544): nothing else is reachable
from them, and they reach nothing else. Given a registry (tests/registry.py), the
kernel image is pushed to it and the nodes get it as production nodes do, by pulling:
each engine reaches the registry at the same address as the host, ``127.0.0.1:<port>``
on its own loopback, through a ``socat`` pair (the namespace's listener to a unix
socket, the host's end of that socket to the registry), and trusts its CA through
/etc/docker/certs.d like the host's engine; the agents pull when a session placed on
them needs the image. Without one, the image is copied into each engine with ``docker
save | docker load``. The engines form a Docker Swarm (the first inits
it, the second joins as a manager: an agent makes its sessions' overlay networks on
its own engine, which only a manager may do). The agents reach their engines through
the unix sockets (a socket is a file: no network between the host and the nodes).

``python -m tests.swarm_nodes up|down`` starts the nodes for manual use / removes
what a killed run left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = "/var/lib/bai-swarm-nodes"  # data roots, sockets, logs (one folder per node)
RUN = "/run/bai-swarm-nodes"  # exec roots (short paths: unix socket names are limited)
IMAGE_DEFAULT = "backendai/python-kernel:latest"


def _run(args, *, check=True, timeout=120, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()}")
    return r


class Node:
    def __init__(self, tag: str, name: str, addr: str):
        self.name = f"baisw-{tag}-{name}"  # namespace name
        self.addr = addr
        self.dir = os.path.join(ROOT, self.name)
        self.exec_root = os.path.join(RUN, self.name)
        self.sock = os.path.join(self.exec_root, "docker.sock")
        self.url = f"unix://{self.sock}"
        self.log = os.path.join(self.dir, "dockerd.log")
        self.pidfile = os.path.join(self.exec_root, "dockerd.pid")
        self.proc: subprocess.Popen | None = None

    def docker(self, *args, check=True, timeout=120, **kw) -> subprocess.CompletedProcess:
        return _run(["docker", "-H", self.url, *args], check=check, timeout=timeout, **kw)

    def start_dockerd(self) -> None:
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        os.makedirs(self.exec_root, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{self.name}",
                 "dockerd", "--data-root", os.path.join(self.dir, "data"),
                 "--exec-root", self.exec_root, "-H", self.url, "--pidfile", self.pidfile,
                 "--cgroup-parent", f"/{self.name}", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd of {self.name} exited ({self.proc.returncode}): "
                                   f"{self.tail()}")
            if os.path.exists(self.sock) and self.docker("version", check=False,
                                                         timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"dockerd of {self.name} did not answer in {timeout:g} s: {self.tail()}")

    def tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def stop_dockerd(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    # -- what the tests look at -------------------------------------------------

    def containers(self, agent_id: str | None = None) -> list[str]:
        args = ["ps", "-aq"] + (["--filter", f"label=ai.backend.agent-id={agent_id}"] if agent_id else [])
        return self.docker(*args).stdout.split()

    def session_networks(self) -> list[str]:
        """Names of the networks the agents made for sessions (bridge or overlay)."""
        out = self.docker("network", "ls", "--filter", "label=ai.backend.network=session",
                          "--format", "{{.Name}}").stdout.split()
        return sorted(out)


class SwarmNodes:
    """Two namespaced Docker engines joined as a Swarm; ``stop()`` removes everything.

    ``registry`` (a started tests/registry.py ``Registry``): the image is pushed there
    (``image_ref``) and the nodes pull it; otherwise it is loaded into both."""

    REPO = "swarm/kernel"

    def __init__(self, image: str = IMAGE_DEFAULT, registry=None):
        self.image = image
        self.registry = registry
        self.image_ref = image
        self.forwarders: list[subprocess.Popen] = []
        self.tag = os.urandom(2).hex()
        n = int(self.tag, 16) % 250 + 1
        self.subnet = f"198.18.{n}"
        self.nodes = [Node(self.tag, "a", f"{self.subnet}.1"), Node(self.tag, "b", f"{self.subnet}.2")]
        self.veth = (f"bsw{self.tag}a", f"bsw{self.tag}b")
        self.timings: dict[str, float] = {}

    # -- setup ----------------------------------------------------------------------

    def start(self) -> SwarmNodes:
        t0 = time.monotonic()
        self._netns()
        for node in self.nodes:
            node.start_dockerd()
        for node in self.nodes:
            node.wait_ready()
        self.timings["engines_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        if self.registry is not None:
            self.image_ref = self.registry.push(self.image, self.REPO, self.tag)
            self._forward_registry()
            self.timings["image_push_s"] = time.monotonic() - t0
        else:
            self._load_image()
            self.timings["image_load_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        self._swarm()
        self.timings["swarm_s"] = time.monotonic() - t0
        return self

    def _netns(self) -> None:
        a, b = self.nodes
        for node in self.nodes:
            _run(["ip", "netns", "add", node.name])
            _run(["ip", "-n", node.name, "link", "set", "lo", "up"])
        _run(["ip", "link", "add", self.veth[0], "netns", a.name, "type", "veth",
              "peer", "name", self.veth[1], "netns", b.name])
        for node, dev in zip(self.nodes, self.veth, strict=True):
            _run(["ip", "-n", node.name, "addr", "add", f"{node.addr}/24", "dev", dev])
            _run(["ip", "-n", node.name, "link", "set", dev, "up"])

    def _forward_registry(self) -> None:
        """The registry at ``127.0.0.1:<port>`` inside each node's namespace: there a
        ``socat`` listens and connects to a unix socket (a file: seen from every
        namespace), whose host end connects to the registry on the host's loopback."""
        port = self.registry.port
        sock = os.path.join(self.nodes[0].exec_root, "registry.sock")

        def spawn(args):
            p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            self.forwarders.append(p)
            return p

        spawn(["socat", f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:127.0.0.1:{port}"])
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if time.monotonic() > deadline or self.forwarders[0].poll() is not None:
                raise RuntimeError(f"socat for the registry did not listen on {sock}")
            time.sleep(0.05)
        for node in self.nodes:
            spawn(["nsenter", f"--net=/var/run/netns/{node.name}", "socat",
                   f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{sock}"])
        for node in self.nodes:  # the registry answers from inside the namespace
            deadline = time.monotonic() + 10
            while _run(["nsenter", f"--net=/var/run/netns/{node.name}", "bash", "-c",
                        f"exec 3<>/dev/tcp/127.0.0.1/{port}"], check=False,
                       timeout=10).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the registry is not reachable from {node.name}")
                time.sleep(0.1)

    def holds(self, node: Node) -> list[str]:
        """The registry digests of the image that ``node``'s engine holds."""
        r = node.docker("image", "inspect", "--format", "{{json .RepoDigests}}",
                        self.image_ref, check=False)
        return [] if r.returncode else sorted(json.loads(r.stdout))

    def _load_image(self) -> None:
        """``docker save`` once, ``docker load`` into both engines at the same time."""
        save = subprocess.Popen(["docker", "save", self.image], stdout=subprocess.PIPE)
        loads = [subprocess.Popen(["docker", "-H", n.url, "load", "-q"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for n in self.nodes]
        try:
            while chunk := save.stdout.read(1 << 20):
                for p in loads:
                    p.stdin.write(chunk)
        finally:
            for p in loads:
                p.stdin.close()
        errors = []
        for p in loads:
            errors.append(p.stderr.read().decode(errors="replace").strip())
            p.wait(300)
        if save.wait() != 0 or any(p.returncode for p in loads):
            raise RuntimeError(f"could not copy {self.image} into the nodes: {errors}")

    def _swarm(self) -> None:
        a, b = self.nodes
        a.docker("swarm", "init", "--advertise-addr", a.addr, "--listen-addr", f"{a.addr}:2377")
        token = a.docker("swarm", "join-token", "-q", "manager").stdout.strip()
        b.docker("swarm", "join", "--token", token, "--advertise-addr", b.addr,
                 "--listen-addr", f"{b.addr}:2377", f"{a.addr}:2377", timeout=60)

    # -- teardown -------------------------------------------------------------------

    def stop(self) -> None:
        """Everything goes, whatever state a failed test left: containers, engines,
        namespaces (with the veth pair), data and exec roots."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                left = node.docker("ps", "-aq", check=False, timeout=30).stdout.split()
                if left:
                    node.docker("rm", "-f", *left, check=False, timeout=60)
        for node in reversed(self.nodes):
            node.stop_dockerd()
        for p in self.forwarders:
            stop_forwarder(p)
        for node in self.nodes:
            _cleanup_node(node.name)


def stop_forwarder(p: subprocess.Popen) -> None:
    """A socat of :meth:`SwarmNodes._forward_registry` and the children it forked."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)


def _kill_forwarders(name: str) -> None:
    """The socats a killed run left for node ``name`` (their command lines name its
    exec root)."""
    mark = os.path.join(RUN, name).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if cmd.startswith((b"socat\0", b"nsenter\0")) and mark in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _cleanup_node(name: str) -> None:
    """Remove a node's namespace, mounts and folders (also one a killed run left). The
    data root (the loaded image: ~10^5 files) is renamed away and deleted by a detached
    ``rm -rf``, which takes up to a minute on a busy disk; nothing uses it any more."""
    for base in (RUN, ROOT):
        d = os.path.join(base, name)
        # Mounts dockerd left (overlay layers, netns bind mounts), deepest first.
        try:
            with open("/proc/self/mounts") as f:
                mounts = [line.split()[1] for line in f]
        except OSError:
            mounts = []
        for m in sorted((m for m in mounts if m == d or m.startswith(d + "/")), reverse=True):
            _run(["umount", "-l", m], check=False)
        if base == ROOT and os.path.isdir(d):
            trash = os.path.join(ROOT, f".trash-{name}-{os.urandom(3).hex()}")
            os.rename(d, trash)
            subprocess.Popen(["rm", "-rf", trash], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            shutil.rmtree(d, ignore_errors=True)
    if os.path.exists(f"/var/run/netns/{name}"):
        _run(["ip", "netns", "del", name], check=False)


def _dockerd_pid(exec_root: str) -> int | None:
    try:
        with open(os.path.join(exec_root, "dockerd.pid")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def cleanup_leftovers() -> list[str]:
    """Nodes a killed test run left: stop their dockerd (by its pid file), remove the rest."""
    names = set()
    for base in (RUN, ROOT):
        if os.path.isdir(base):
            names.update(n for n in os.listdir(base) if n.startswith("baisw-"))
    if os.path.isdir("/var/run/netns"):
        names.update(n for n in os.listdir("/var/run/netns") if n.startswith("baisw-"))
    for name in sorted(names):
        pid = _dockerd_pid(os.path.join(RUN, name))
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
                for _ in range(150):
                    with open(f"/proc/{pid}/status") as f:
                        if "\nState:\tZ" in f.read():
                            break  # exited (its parent, a finished run, does not reap it)
                    time.sleep(0.2)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, FileNotFoundError):
                pass
        _kill_forwarders(name)
        _cleanup_node(name)
    return sorted(names)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "up"
    if cmd == "down":
        print("removed:", cleanup_leftovers())
    elif cmd == "up":
        nodes = SwarmNodes().start()
        for n in nodes.nodes:
            print(n.name, n.addr, n.url)
        print(nodes.timings)
    else:
        raise SystemExit("usage: python -m tests.swarm_nodes up|down")
