"""Real PostgreSQL, Redis and etcd servers for the tests, each on its own free port.

Started once per test run, stopped by PID at the end. They need the Debian
packages that ``scripts/test`` installs.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

# This run's token: in every agent id, image tag and other engine object the suite makes,
# so that the end-of-run check (tests/conftest.py) and a clean-up find this run's
# objects and never another suite's on the same engine. scripts/test sets it; pytest's
# xdist workers inherit it from the controller.
_OWN_RUN = "BACKENDAI_TEST_RUN" not in os.environ  # (a benchmark; pytest run by hand)
RUN = os.environ.setdefault("BACKENDAI_TEST_RUN", secrets.token_hex(4))


def agent_id(kind: str = "test") -> str:
    """A fresh agent id of this run: ``i-<kind>-<run>-<random>`` (never the default
    ``i-<hostname>``; never one another test, worker or suite uses)."""
    return f"i-{kind}-{RUN}-{secrets.token_hex(4)}"


#: The agents' shared network (Agent.network) of this run: every agent the suite runs on
#: the main engine (hubs, daemons, in-process agents) inherits it, and the run removes it
#: at its end (tests/conftest.py); the engine's ``backendai``, which installations share
#: and none removes, is not made or touched by the suite.
AGENT_NETWORK = os.environ.setdefault("BACKENDAI_AGENT_NETWORK", f"t{RUN}-backendai")


def _remove_own_agent_network(owner: int) -> None:
    """At the exit of the process that made this run (a benchmark; not a forked hub, not
    an xdist worker, which inherit the run): its agent network goes too. The suite's
    own end does this in tests/conftest.py; the benchmarks left one network per run."""
    if os.getpid() == owner:
        from .engine_check import remove_agent_network  # (it imports this module)

        remove_agent_network()


if _OWN_RUN and AGENT_NETWORK == f"t{RUN}-backendai":
    atexit.register(_remove_own_agent_network, os.getpid())


#: What every test hub's installation id starts with (BACKENDAI_INSTALLATION_PREFIX): a
#: hub on the default agent id (``i-<hostname>-<this prefix><8 hex>``) and every container
#: and network its agent labels with its installation carry this run's token.
INSTALLATION_PREFIX = f"t{RUN}-"


# Agents' host ports (Agent.port_range): below the kernel's ephemeral range (32768 and
# up here, where every outgoing connection and every free_port() takes its port), in a
# band of each xdist worker's own. An agent checks that a port is free when it hands it
# out, but a local kernel binds it a moment later: a client socket or another worker's
# agent taking it in between made a spawn fail with 500 under load.
_BANDS = (12000, 32000, 8)
_next_block: dict[str, int] = {}


def _worker_band(bands: tuple[int, int, int]) -> tuple[int, int]:
    """(first port, size) of this process's band of ``(lo, hi, bands)``: its xdist
    worker's band, and of that the part of its suite slot (:func:`suite_slot`)."""
    lo, hi, n = bands
    size = (hi - lo) // n
    part = size // SUITE_SLOTS
    return lo + _worker_index() % n * size + suite_slot() * part, part


def _worker_index() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)


# Two suites on one machine at once (CI beside a developer's run): the processes of one
# worker index in both would walk the same band, and a port one of them had handed out,
# not yet bound by its server, looked free to the other (EADDRINUSE: a pair of suites
# lost 14 module setups, stop 32). So each worker's band is split in SUITE_SLOTS parts,
# and a process takes the part of the slot whose lock it holds: an flock per worker index
# and slot, held for the process's life (the kernel drops it when the process ends, also
# when it is killed). No other live process of that worker index has that part.
SUITE_SLOTS = 2
_slot: list[int] = []


def suite_slot() -> int:
    """This process's suite slot: the first whose lock no other live process of this
    worker index holds (taken once; a third suite at once shares one by its run token,
    as before slots, and is told so)."""
    if not _slot:
        lock_dir = os.environ.get("BACKENDAI_TEST_LOCK_DIR") or tempfile.gettempdir()
        for k in range(SUITE_SLOTS):
            path = os.path.join(lock_dir, f"backendai-test-ports-gw{_worker_index()}-{k}.lock")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _slot.append(k)  # fd stays open (and locked) until the process ends
            break
        else:
            _slot.append(int(RUN, 16) % SUITE_SLOTS)
            print(f"[services] every port slot of worker {_worker_index()} is held by "
                  f"other suites: sharing slot {_slot[0]}", file=sys.stderr)
    return _slot[0]


# Ports are handed out in turn: one thread at a time (a test or benchmark asking from
# several threads at once got the same port twice: EADDRINUSE in one of them).
_hand_out = threading.Lock()


def port_block(width: int) -> int:
    """The first port of ``width + 1`` free host ports for an agent's port range, never
    handed out twice by this process while its band has room, and never to two workers."""
    with _hand_out:
        return _port_block(width)


def _port_block(width: int) -> int:
    start, size = _worker_band(_BANDS)
    end = start + size
    # (a second suite at once starts at another block of the band: its run token)
    first = _next_block.get("at", start + int(RUN, 16) % (size // (width + 1)) * (width + 1))
    for _ in range(size // (width + 1) + 1):
        if first + width >= end:
            first = start
        block = range(first, first + width + 1)
        _next_block["at"] = first + width + 1
        if all(_port_free(p) for p in block):
            return first
        first += width + 1
    raise RuntimeError(f"no {width + 1} free ports left in {start}-{end}")


def port_range(width: int) -> tuple[int, int]:
    """:func:`port_block` as an ``Agent.port_range`` (first, last)."""
    lo = port_block(width)
    return (lo, lo + width)


# Ports Chromium refuses to load from (net::ERR_UNSAFE_PORT; its net/base/port_util.cc),
# those inside the bands below: a hub on 4045 could not be opened in the browser tests.
CHROMIUM_UNSAFE = frozenset({2049, 3659, 4045, 4190, 5060, 5061, 6000, 6566, 6665, 6666,
                             6667, 6668, 6669, 6679, 6697, 10080})


def _port_free(port: int) -> bool:
    """Nothing holds ``port`` on IPv4 or IPv6 (``localhost`` is tried on ::1 first, by
    ssh for one, where another server would answer in place of ours), and a browser may
    open it (not one of :data:`CHROMIUM_UNSAFE`)."""
    if port in CHROMIUM_UNSAFE:
        return False
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")):
        with socket.socket(family) as s:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # As every server binds (tornado, docker-proxy) and as the agent checks its
            # ports (agent/portclaims.py): a port whose only sockets are closed connections
            # in TIME_WAIT is free. Without it, the kernels' ports of the modules just
            # before stayed "taken" for a minute, and a worker's band once held no free
            # block for a new hub (runs R2 and CC: "no 201 free ports left").
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                if family == socket.AF_INET6 and e.errno == errno.EADDRNOTAVAIL:
                    continue  # (no IPv6 here)
                return False
    return True


def image_tag(repo: str, variant: str = "") -> str:
    """A tag of this run for an image a test builds (``backendai-test/<repo>:<run>[-v]``):
    the end-of-run check finds it if the test left it behind."""
    return f"backendai-test/{repo}:{RUN}" + (f"-{variant}" if variant else "")


# Every other port a test gives a server it starts (hubs and their proxies, databases,
# the CLIs' local proxies): below the ephemeral range as well, in a band of each worker's
# own, handed out in turn. A port from bind(0) is free only at the moment it is asked
# for: while a hub started (seconds), another worker's bind(0) took the port its proxy
# was to listen on (EADDRINUSE; the hub then asked that other server for its routes and
# died). In turn, a port comes back to this process only after the whole band; a second
# suite at once starts elsewhere in the band (its run token).
_FREE_BAND = (2000, 12000, 8)
_next_free: dict[str, int] = {}


def free_port() -> int:
    """A port nothing holds now, that no other worker of this run hands out."""
    with _hand_out:
        return _free_port()


def _free_port() -> int:
    start, size = _worker_band(_FREE_BAND)
    at = _next_free.get("at", start + int(RUN, 16) % size)
    for _ in range(size):
        port, at = at, start + (at - start + 1) % size
        if _port_free(port):
            _next_free["at"] = at
            return port
    raise RuntimeError(f"no free port left in {start}-{start + size - 1}")


def foreign_subnets(n: int = 1) -> list[str]:
    """``n`` /24s for networks a test makes as another tool would (``docker network
    create``): in 192.168.128.0/17, outside every network of the engine now, at random
    (another worker or suite picks elsewhere; a create that meets one made meanwhile
    fails on the overlap, loudly). Left to Docker, such a network gets a whole /16 of
    its default pools, and once that was 172.30.0.0/16, the default session pool of
    every hub and agent of the run: their sessions got no network (stop 34)."""
    import ipaddress
    import json
    import random

    from jupyterhub_backendai.agent.backends.networks import subnets_of

    ids = subprocess.run(["docker", "network", "ls", "-q"], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    shown = subprocess.run(["docker", "network", "inspect", *ids], capture_output=True,
                           text=True, timeout=60).stdout if ids else ""
    used = subnets_of(json.loads(shown or "[]"))
    free = [str(b) for b in ipaddress.ip_network("192.168.128.0/17").subnets(new_prefix=24)
            if not any(b.overlaps(u) for u in used)]
    return random.sample(free, n)


def wait_port(port: int, timeout: float = 30, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open in {timeout} s")


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 15 s; waits for the exit."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Service:
    def __init__(self, name: str):
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.dir = tempfile.mkdtemp(prefix=f"bai-{name}-")
        self.port = free_port()

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
    return found[-1]


class Postgres(Service):
    """A throwaway cluster: initdb refuses root, so it runs as the postgres user."""

    def __init__(self):
        super().__init__("pg")
        pw = pwd.getpwnam("postgres")
        os.chmod(self.dir, 0o755)
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        os.chown(data, pw.pw_uid, pw.pw_gid)
        sock = os.path.join(self.dir, "sock")
        os.makedirs(sock)
        os.chown(sock, pw.pw_uid, pw.pw_gid)
        self.sock = sock

        def as_postgres():
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)

        subprocess.run(
            [_pg_bin("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True, stdout=subprocess.DEVNULL, preexec_fn=as_postgres,
        )
        self._cmd = [_pg_bin("postgres"), "-D", data, "-p", str(self.port), "-k", sock,
                     "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                     "-c", "max_connections=300", "-c", "synchronous_commit=off",
                     "-c", "full_page_writes=off"]
        self._as_postgres = as_postgres
        self.resume()

    def resume(self) -> None:
        """Start the server (again, on the same data and port) and wait for logins."""
        self.proc = subprocess.Popen(
            self._cmd, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "log"), "a"), preexec_fn=self._as_postgres,
        )
        wait_port(self.port, proc=self.proc)
        # Accepting TCP is not the same as accepting logins during startup.
        for _ in range(100):
            if self.psql("SELECT 1", check=False).returncode == 0:
                break
            time.sleep(0.1)

    def pause(self) -> None:
        """Stop the server (an outage), keeping its data for ``resume``: a fast shutdown
        (SIGINT), which ends the clients' connections instead of waiting for them."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)

    def psql(self, sql: str, db: str = "postgres", check: bool = True):
        return subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
             "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
            check=check, capture_output=True, text=True,
        )

    def new_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"


class Redis(Service):
    def __init__(self, *extra: str):
        """``extra``: more redis-server arguments (e.g. ``--aclfile PATH``)."""
        super().__init__("redis")
        self._cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--dir", self.dir,
                     "--databases", "256", *extra]
        self.resume()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._next_db = 1

    def resume(self) -> None:
        """Start the server (again, on the same port; its data is gone: ``--save ""``)."""
        self.proc = subprocess.Popen(self._cmd, stdout=subprocess.DEVNULL)
        wait_port(self.port, proc=self.proc)

    def pause(self) -> None:
        """Stop the server (a bus outage)."""
        stop_process(self.proc)

    def fresh_url(self) -> str:
        """The URL of a database no other test has used (emptied): a test's event bus
        starts with no stream, group or backlog left by another test's agents."""
        import redis

        db, self._next_db = self._next_db, self._next_db + 1
        url = f"redis://127.0.0.1:{self.port}/{db}"
        redis.Redis.from_url(url).flushdb()
        return url


class Etcd(Service):
    def __init__(self):
        super().__init__("etcd")
        peer = free_port()
        self.proc = subprocess.Popen(
            ["etcd", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", f"http://127.0.0.1:{self.port}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)


STORAGE_PROXY_BIN = os.path.join(os.path.dirname(sys.executable), "backendai-storage-proxy")


class StorageDaemon:
    """A ``backendai-storage-proxy`` subprocess serving ``volume1`` and ``volume2``
    under ``root``, configured through a config file; stopped by its PID."""

    def __init__(self, root: str, extra_config: str = ""):
        self.root = str(root)
        self.extra_config = extra_config  # more config-file lines
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.volumes = {
            name: {"backend": "vfs", "path": os.path.join(self.root, name)}
            for name in ("volume1", "volume2")
        }
        self.config = os.path.join(self.root, "storage_config.py")
        self.log = os.path.join(self.root, "storage-proxy.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> None:
        with open(self.config, "w") as f:
            f.write(f"c.StorageProxyApp.volumes = {self.volumes!r}\n")
            f.write(f"c.StorageProxyApp.listen_port = {self.port}\n")
            f.write(self.extra_config)
        env = dict(os.environ, BACKENDAI_STORAGE_TOKEN=self.token)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [STORAGE_PROXY_BIN, "--config", self.config], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while True:  # ready when the API answers, not merely when the port opens
            if self.proc.poll() is not None:
                raise RuntimeError(f"storage proxy exited with {self.proc.returncode}: {self.tail()}")
            try:
                req = urllib.request.Request(
                    self.url + "/v1/volumes", headers={"Authorization": f"Bearer {self.token}"}
                )
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"storage proxy not ready in {timeout} s: {self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
