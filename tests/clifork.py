"""The official Backend.AI CLI, and the tests' hubs, run without paying their imports
each time.

Hubs (:func:`hub`, used by ``tests/hub.py``): each test process forks its hubs from a
second fork server that imported JupyterHub and the platform once (``HUB_PRELOAD``). A
hub start took 2.2-2.5 CPU-s until it answered, 0.8-0.9 forked (about 150 starts a
suite). The hub is ``python -m jupyterhub_backendai.launcher`` as before, in a session of
its own; only its imports were done before its command line was known.

Every ``backend.ai`` command imports the whole client first (its commands are loaded
from entry points at import): 0.5 CPU-s of a 0.8 s run for 23.09, more for 26.09, and
the suite runs it about a thousand times. Beside a second suite on two cores, that
import was the largest single consumer of the suite's CPU (process accounting, stop 34).

So each test process starts, per client environment, one *fork server*: the
environment's own interpreter runs this file, executes the console script's imports once
(``bin/backend.ai`` with a ``__name__`` other than ``__main__``: its entry points loaded,
its ``main`` not called) and waits on a Unix socket. :func:`executable` returns a small
launcher for it. Run as the CLI would be (``subprocess.run([launcher, *args], env=...,
cwd=..., input=...)``), the launcher passes its argv, environment, working directory and
its three standard streams (the file descriptors themselves) to the server, which forks;
the child takes them over and runs the console script as ``__main__``, as the real
executable does, with ``sys.argv[0]`` the real script's path. The exit status comes back
to the launcher, which exits with it (a child killed by a signal: the launcher kills
itself with the same signal). SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher
are forwarded to the child (a test's Ctrl-C); a launcher that dies (a test's timeout
kills it) has its child killed.

What the CLI does is unchanged: its own code, in its own process, with its own
interpreter and packages, talking HTTP to the hub. What differs from the executable is
only that the modules were imported before the command line was known. The client reads
its configuration (``BACKEND_*``) when a command runs, not at import, and the server
refuses to serve if importing started a thread (a fork copies only the forking
thread). ``BAI_FORK=0`` makes :func:`executable` return the real script (every command
then imports the client again) and ``tests/hub.py`` start each hub as its own
interpreter, and ``test_backendai_client.py`` runs one test with the real script always.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_STATUS = struct.Struct("!i")

_LAUNCHER = """#!{python} -IS
import json, os, signal, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({sock!r})
req = json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
socket.send_fds(s, [struct.pack("!I", len(req)) + req], [0, 1, 2])
def status():
    b = b""
    while len(b) < 4:
        got = s.recv(4 - len(b))
        if not got:
            sys.stderr.write("backend.ai (forked): the fork server went away\\n")
            sys.exit(70)
        b += got
    return struct.unpack("!i", b)[0]
pid = status()
if {pidfile!r}:
    with open({pidfile!r} + ".tmp", "w") as f:
        f.write(str(pid))
    os.replace({pidfile!r} + ".tmp", {pidfile!r})
def forward(sig, frame):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
for sig in {signals!r}:
    signal.signal(sig, forward)
code = status()
if code < 0:
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # (those cannot be caught)
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


# -- the test side -------------------------------------------------------------------

_servers: dict[str, tuple[subprocess.Popen, str]] = {}
_lock = threading.Lock()


def executable(script: str) -> str:
    """A launcher that runs the console script ``script`` (``<venv>/bin/backend.ai``)
    through this process's fork server for its environment (started on first use), or
    ``script`` itself under ``BAI_FORK=0``."""
    if not forking():
        return script
    with _lock:
        got = _servers.get(script)
        if got is not None and got[0].poll() is None:
            return got[1]
        proc, launcher = _start(script)
        _servers[script] = (proc, launcher)
        return launcher


def forking() -> bool:
    """Whether commands and hubs are forked (``BAI_FORK=0``: each runs as itself)."""
    return os.environ.get("BAI_FORK", "1") != "0"


def hub(args: list[str], pidfile: str, **popen) -> ForkedProcess:
    """``python -m jupyterhub_backendai.launcher *args`` (a test's hub), forked from this
    process's hub fork server: JupyterHub and the platform imported once per test
    process instead of once per hub (see above). The hub becomes the leader of a session
    of its own (as ``start_new_session``), and what is returned stands for it: its
    ``pid`` is the hub's, signals go to the hub, and ``poll``/``wait`` give its exit
    status."""
    with _lock:
        got = _servers.get(HUB_MODULE)
        if got is None or got[0].poll() is not None:
            got = _servers[HUB_MODULE] = _start(HUB_MODULE)
    try:
        os.unlink(pidfile)  # (a hub started again: its last pid file)
    except FileNotFoundError:
        pass
    launcher = pidfile + ".launcher"  # (one per hub: it writes that hub's pid file)
    with open(launcher, "w") as f:
        f.write(_LAUNCHER.format(python=sys.executable, sock=_sock(got[1]),
                                 signals=[int(s) for s in FORWARDED], pidfile=pidfile))
    os.chmod(launcher, 0o755)
    proc = subprocess.Popen([launcher, *args], start_new_session=True, **popen)
    deadline = time.monotonic() + 60
    while not os.path.exists(pidfile):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the hub fork server forked no hub (launcher: {proc.poll()})")
        time.sleep(0.01)
    with open(pidfile) as f:
        return ForkedProcess(proc, int(f.read()))


HUB_MODULE = "jupyterhub_backendai.launcher"
# Imported by the hub fork server before it forks: what a hub start imports (JupyterHub
# through hubmain, with its guard against the optional iri checker first; the platform).
# (Not pynvml: a test's NVML stand-in may take its place.)
HUB_PRELOAD = ("jupyterhub_backendai.hubmain", "jupyterhub_backendai.cli",
               "jupyterhub_backendai.spawner", "jupyterhub_backendai.manager.core",
               "jupyterhub_backendai.api.handlers", "jupyterhub_backendai.api.models",
               "jupyterhub_backendai.pages", "jupyterhub_backendai.agent.backends.docker",
               "dockerspawner", "sqlalchemy.dialects.sqlite.aiosqlite", "tornado.websocket",
               "requests")


class ForkedProcess:
    """A forked hub, as much of ``subprocess.Popen`` as the tests use: ``pid`` is the
    hub's own; its exit status comes through its launcher (which exits with it)."""

    def __init__(self, launcher: subprocess.Popen, pid: int):
        self.launcher = launcher
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self.launcher.returncode

    def poll(self) -> int | None:
        return self.launcher.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.launcher.wait(timeout)

    def send_signal(self, sig: int) -> None:
        if self.launcher.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _sock(launcher: str) -> str:
    return os.path.join(os.path.dirname(launcher), "server.sock")


def _start(script: str) -> tuple[subprocess.Popen, str]:
    where = tempfile.mkdtemp(prefix="backendai-clifork-")
    sock = os.path.join(where, "server.sock")
    if script == HUB_MODULE:  # this interpreter; the test's environment (for the imports)
        python = sys.executable
        env = {**os.environ, "HOME": os.environ.get("HOME", where)}
    else:
        python = os.path.join(os.path.dirname(script), "python")
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": where}
    proc = subprocess.Popen([python, __file__, sock, script], env=env, cwd=where,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        rest = proc.stdout.read() if proc.poll() is not None else ""
        proc.kill()
        raise RuntimeError(f"the fork server of {script} did not start: {line}{rest}")
    proc.stdout.close()
    launcher = os.path.join(where, "backend.ai")
    with open(launcher, "w") as f:
        f.write(_LAUNCHER.format(python=sys.executable, sock=sock,
                                 signals=[int(s) for s in FORWARDED], pidfile=""))
    os.chmod(launcher, 0o755)
    atexit.register(_stop, proc, where)
    return proc, launcher


def _stop(proc: subprocess.Popen, where: str) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    for name in ("server.sock", "backend.ai"):
        try:
            os.unlink(os.path.join(where, name))
        except OSError:
            pass
    try:
        os.rmdir(where)
    except OSError:
        pass


# -- the server (run by the client environment's interpreter) ------------------------


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4:
        data += conn.recv(4 - len(data))
    (size,) = struct.unpack("!I", data[:4])
    body = data[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            break
        body += more
    return json.loads(body), fds


def _stdio() -> None:
    """Standard streams on fds 0-2 as Python's startup makes them (UTF-8 locale)."""
    import io
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        open(0, "rb", closefd=False), encoding="utf-8", errors="strict",
        line_buffering=False)
    out_tty = os.isatty(1)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        open(1, "wb", closefd=False),
        encoding="utf-8", errors="strict", line_buffering=out_tty)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        open(2, "wb", closefd=False), encoding="utf-8", errors="backslashreplace",
        line_buffering=True)


def _child(req: dict, fds: list[int], script: str, keep_closed: list[int]) -> None:
    """In the forked child: become the CLI run with the request's argv, environment,
    working directory and streams; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in keep_closed:
            try:
                os.close(fd)
            except OSError:
                pass
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _stdio()
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import runpy
        try:
            if script == HUB_MODULE:
                os.setsid()
                sys.path[0] = os.getcwd()  # as ``python -m`` has it
                sys.argv = [script, *req["argv"]]  # (run_module sets argv[0] to its file)
                sys.modules.pop(script, None)  # (imported by the preload: run afresh)
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [script, *req["argv"]]
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            import traceback
            traceback.print_exc()
            code = -signal.SIGINT
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        if code < 0:  # as Python does for an uncaught KeyboardInterrupt: die by the signal
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)


def serve(sock_path: str, script: str) -> None:
    import selectors
    if script == HUB_MODULE:
        sys.path[0] = os.getcwd()  # (not tests/, whose module names would shadow)
        import importlib
        for name in HUB_PRELOAD:
            importlib.import_module(name)
    else:
        with open(script) as f:
            code = compile(f.read(), script, "exec")
        exec(code, {"__name__": "__clifork_preload__", "__file__": script})
    if threading.active_count() != 1:
        print(f"importing {script} started threads: a fork would lose them", flush=True)
        sys.exit(2)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    stopping: list[int] = []  # SIGTERM (the test process's exit): the children go too
    signal.signal(signal.SIGTERM, lambda sig, frame: stopping.append(sig))
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, None)
    sel.register(wake_r, selectors.EVENT_READ, None)
    children: dict[int, socket.socket] = {}
    parent = os.getppid()
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)  # the pipe to the test is closed now
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = children.pop(pid, None)
            if conn is None:
                continue
            try:
                sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            try:
                conn.sendall(_STATUS.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            conn.close()

    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is srv:
                conn, _ = srv.accept()
                try:
                    req, fds = _recv_request(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                keep_closed = [srv.fileno(), wake_r, wake_w, conn.fileno(),
                               *(c.fileno() for c in children.values())]
                pid = os.fork()
                if pid == 0:
                    _child(req, fds, script, keep_closed)
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                conn.sendall(_STATUS.pack(pid))
                sel.register(conn, selectors.EVENT_READ, pid)
            elif key.fileobj == wake_r:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                reap()
            else:  # the launcher went away (killed): its child goes too
                try:
                    gone = not key.fileobj.recv(1)
                except OSError:
                    gone = True
                if gone:
                    sel.unregister(key.fileobj)
                    try:
                        os.kill(key.data, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        reap()
        if stopping or os.getppid() != parent:  # (or it ended without stopping us)
            for pid in list(children):
                try:  # a hub leads a process group of its own: all of it
                    os.kill(-pid if script == HUB_MODULE else pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
