"""Cluster-mode nodes for tests (issue 11): certificates made by the documented
command, ``backendai-agent`` and ``backendai-storage-proxy`` daemons with mutual TLS,
and an etcd of the test's own that can be killed and started again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from .services import agent_id as new_agent_id
from .services import free_port, port_block, stop_process, wait_port

BIN = os.path.dirname(sys.executable)


def make_certs(directory, *nodes: str) -> dict[str, dict[str, str]]:
    """Run ``python -m jupyterhub_backendai.common.certs DIR --node ...`` (docs/cluster.md)."""
    args = [sys.executable, "-m", "jupyterhub_backendai.common.certs", str(directory)]
    for n in nodes:
        args += ["--node", f"{n}=localhost,127.0.0.1"]
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=120)
    from jupyterhub_backendai.common.certs import node_files

    return {n: node_files(str(directory), n) for n in ("hub", *nodes)}


class RestartableEtcd:
    """An etcd on fixed ports that a test may kill (-9) and start again, with its data
    directory or (``wipe=True``) without."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="bai-etcd-")
        self.port = free_port()
        self.peer = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, wipe: bool = False) -> None:
        data = os.path.join(self.dir, "data")
        if wipe:
            shutil.rmtree(data, ignore_errors=True)
        self.proc = subprocess.Popen(
            ["etcd", "--data-dir", data,
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-cluster", f"default=http://127.0.0.1:{self.peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def get_prefix(self, prefix: str) -> dict[str, dict]:
        """Keys under ``prefix`` with their JSON values (etcdctl, no Python client)."""
        r = subprocess.run(
            ["etcdctl", "--endpoints", self.url, "get", "--prefix", prefix, "-w", "json"],
            capture_output=True, text=True, timeout=30,
        )
        if r.returncode != 0:
            return {}
        import base64

        out = {}
        for kv in json.loads(r.stdout).get("kvs", []) or []:
            out[base64.b64decode(kv["key"]).decode()] = json.loads(base64.b64decode(kv["value"]))
        return out

    def put(self, key: str, value: dict) -> None:
        subprocess.run(["etcdctl", "--endpoints", self.url, "put", key, json.dumps(value)],
                       check=True, capture_output=True, timeout=30)

    def delete(self, key: str) -> None:
        subprocess.run(["etcdctl", "--endpoints", self.url, "del", key],
                       check=True, capture_output=True, timeout=30)


class AgentDaemon:
    """``backendai-agent`` (local backend) with TLS, Redis and optionally etcd."""

    def __init__(self, root, agent_id: str, redis_url: str, certs: dict | None, *,
                 etcd_url: str = "", lease_ttl: float = 3.0, token: str = "",
                 slots: str = "{'cpu': 1, 'mem': '2g'}"):
        self.root = str(root)
        os.makedirs(self.root, exist_ok=True)
        self.agent_id = agent_id
        self.port = free_port()
        self.url = f"{'https' if certs else 'http'}://127.0.0.1:{self.port}"
        lo = port_block(20)
        self.config = os.path.join(self.root, "agent_config.py")
        with open(self.config, "w") as f:
            f.write(
                f"c.Agent.slots = {slots}\n"
                f"c.Agent.port_range = ({lo}, {lo + 20})\n"
                f"c.Agent.heartbeat_interval = 1.0\n"
                f"c.Agent.local_work_root = {os.path.join(self.root, 'home')!r}\n"
                f"c.AgentApp.etcd_lease_ttl = {lease_ttl}\n"
            )
            if certs:
                f.write(f"c.AgentApp.tls = {certs!r}\n")
            if etcd_url:
                f.write(f"c.AgentApp.etcd_url = {etcd_url!r}\n")
        self.env = {k: v for k, v in os.environ.items() if k != "BACKENDAI_AGENT_TOKEN"}
        if token:
            self.env["BACKENDAI_AGENT_TOKEN"] = token
        self.redis_url = redis_url
        self.log = os.path.join(self.root, "agent.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "backendai-agent"), "--config", self.config, "--backend", "local",
                 "--id", self.agent_id, "--state-dir", os.path.join(self.root, "state"),
                 "--redis", self.redis_url, "--port", str(self.port)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        wait_port(self.port, timeout=60, proc=self.proc)

    def kill(self) -> None:
        """``kill -9`` of the daemon only: its kernel processes (sessions of their own)
        survive, as a crashed agent's containers do."""
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)

    def tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-3000:]

    @property
    def kernel_dir(self) -> str:
        return os.path.join(self.root, "state", "local-kernels")

    def kernels(self) -> list[str]:
        """Kernel ids this daemon's local backend runs (one state file each)."""
        d = self.kernel_dir
        return sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else []

    def kill_kernels(self) -> None:
        """Kill what a failed test left running (the kernels' process groups)."""
        import signal

        for kid in self.kernels():
            try:
                with open(os.path.join(self.kernel_dir, kid + ".json")) as f:
                    os.killpg(int(json.load(f)["container_id"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass


class RestartableRedis:
    """A redis-server on a fixed port that a test may kill (-9) and start again, with
    its data (append-only file) or without."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="bai-redis-")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, wipe: bool = False) -> None:
        if wipe:
            for fn in os.listdir(self.dir):
                path = os.path.join(self.dir, fn)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
            stdout=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class TLSStorageDaemon:
    """``backendai-storage-proxy`` with TLS serving ``volume1`` under ``root``."""

    def __init__(self, root, certs: dict):
        self.root = str(root)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        os.makedirs(self.root, exist_ok=True)
        self.volumes = {"volume1": {"backend": "vfs", "path": os.path.join(self.root, "volume1")}}
        self.config = os.path.join(self.root, "storage_config.py")
        with open(self.config, "w") as f:
            f.write(f"c.StorageProxyApp.volumes = {self.volumes!r}\n")
            f.write(f"c.StorageProxyApp.listen_port = {self.port}\n")
            f.write(f"c.StorageProxyApp.tls = {certs!r}\n")
        self.log = os.path.join(self.root, "storage.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "BACKENDAI_STORAGE_TOKEN"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "backendai-storage-proxy"), "--config", self.config],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        wait_port(self.port, timeout=60, proc=self.proc)

    def stop(self) -> None:
        stop_process(self.proc)


class Cluster:
    """etcd, a Redis of the test's own, two ``backendai-agent`` daemons (distinct ids,
    separate port ranges, mutual TLS, registered in etcd) and a manager on PostgreSQL."""

    def __init__(self, tmp_path, slots: str = "{'cpu': 1, 'mem': '2g'}"):
        self.etcd = RestartableEtcd()
        self.redis = RestartableRedis()
        self.certs = make_certs(tmp_path / "pki", "agent1", "agent2")
        self.daemons = [
            AgentDaemon(tmp_path / n, new_agent_id(f"node-{n}"), self.redis.url,
                        self.certs[n], etcd_url=self.etcd.url, lease_ttl=3.0, slots=slots)
            for n in ("agent1", "agent2")]

    def start(self):
        self.etcd.start()
        self.redis.start()
        for d in self.daemons:
            d.start()

    def configure(self, lost_timeout: float, grace: float):
        def cfg(c):
            c.BackendAIManager.redis_url = self.redis.url
            c.BackendAICluster.etcd_url = self.etcd.url
            c.BackendAICluster.tls = self.certs["hub"]
            c.BackendAIManager.agent_lost_timeout = lost_timeout
            c.BackendAIManager.agent_lost_grace = grace
            c.BackendAIManager.reconcile_interval = 1.0
            c.BackendAIManager.claim_lease = 6.0
        return cfg

    def stop(self):
        for d in self.daemons:
            d.stop()
            d.kill_kernels()
        self.redis.stop()
        self.etcd.stop()
