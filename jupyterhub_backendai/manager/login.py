"""Password logins that cannot be used against others.

Three properties, for :meth:`BackendAIAuthenticator.authenticate`:

- **Hashing off the shared pools.** bcrypt runs on its own small thread pool
  (``LoginGuard.hash_threads``), after the database read that found the user has
  ended, so that password guessing can neither hold database transactions nor
  fill the default thread pool that every database call of the hub (the admin API,
  the spawner, the scheduler) runs on. Waiting checks are bounded
  (``LoginGuard.max_waiting``): beyond it a login is answered 503 at once.
- **The same work for every login name.** A name that matches no user (or a user
  without a password) is checked against a dummy bcrypt hash of the same cost, on
  the same path, so that the answer's timing does not tell which names exist. The
  Prometheus counter ``backendai_login_password_checks_total{against=user|dummy}``
  (``/hub/metrics``) counts both.
- **Throttling** with sliding windows, per account (the user, whether named by
  email or username; a name without a user, lowercased) and per client address (the socket peer, or X-Forwarded-For when the
  peer is a trusted proxy: :func:`jupyterhub_backendai.api.base.client_address`).
  After ``max_failures_per_account`` failed logins of one account, or
  ``max_failures_per_address`` from one address, within ``failure_window`` seconds,
  further attempts are refused with 429 and a ``Retry-After`` header, before any
  password is checked. A successful login clears its account's window (not its
  address's). The windows live in the hub process (JupyterHub runs one).
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import bcrypt
from prometheus_client import Counter
from tornado import web
from traitlets import Float, Integer, default
from traitlets.config import LoggingConfigurable

PASSWORD_CHECKS = Counter(
    "backendai_login_password_checks",
    "Password checks of logins: against a user's hash, or a dummy hash for login names "
    "without one (the same work, so timing does not enumerate users)",
    ["against"],
)
THROTTLED = Counter(
    "backendai_login_throttled",
    "Logins refused with 429 before any password check (too many recent failures)",
    ["by"],
)
BCRYPT_ROUNDS = 10  # tenancy.hash_password's cost; the dummy hash must cost the same


def is_bcrypt_hash(value: str | None) -> bool:
    return bool(value) and len(value) == 60 and value.startswith(("$2a$", "$2b$", "$2y$"))


class SlidingWindow:
    """Failure times per key within the last ``window`` seconds (thread-safe)."""

    def __init__(self, window: float, limit: int, max_keys: int = 100_000) -> None:
        self.window = window
        self.limit = limit
        self.max_keys = max_keys
        self._hits: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._lock = threading.Lock()

    def _prune(self, key: str, now: float) -> collections.deque | None:
        q = self._hits.get(key)
        if q is None:
            return None
        while q and q[0] <= now - self.window:
            q.popleft()
        if not q:
            del self._hits[key]
            return None
        return q

    def retry_after(self, key: str, now: float | None = None) -> float:
        """0 when ``key`` may try now, else the seconds until its oldest failure expires."""
        now = time.monotonic() if now is None else now
        with self._lock:
            q = self._prune(key, now)
            if q is None or len(q) < self.limit:
                return 0.0
            return max(q[-self.limit] + self.window - now, 0.001)

    def hit(self, key: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            q = self._prune(key, now)
            if q is None:
                q = self._hits[key] = collections.deque(maxlen=max(self.limit, 1))
                while len(self._hits) > self.max_keys:  # forget the least recently failed
                    self._hits.popitem(last=False)
            self._hits.move_to_end(key)
            q.append(now)

    def clear(self, key: str) -> None:
        with self._lock:
            self._hits.pop(key, None)


class LoginGuard(LoggingConfigurable):
    """Throttling and password checks of the hub's login (see the module's doc)."""

    max_failures_per_account = Integer(
        10,
        help="""Failed logins of one account (login name) within failure_window seconds
        after which its logins are refused with 429 until the oldest failure leaves the
        window. Bounds how fast anyone guesses one user's password, from any number of
        addresses. 0: no per-account limit.""",
    ).tag(config=True)
    max_failures_per_address = Integer(
        30,
        help="""Failed logins from one client address within failure_window seconds after
        which logins from that address are refused with 429 (whatever the account).
        0: no per-address limit.""",
    ).tag(config=True)
    failure_window = Float(
        300.0,
        help="Seconds of the sliding windows in which failed logins are counted.",
    ).tag(config=True)
    hash_threads = Integer(
        help="""Threads that check passwords (bcrypt), apart from the thread pool that runs
        the hub's database work, so that guessing cannot slow the rest of the hub down.
        Default: a quarter of the CPUs (at least 1, at most 4), leaving the others to the
        hub while it is being guessed at.""",
    ).tag(config=True)
    hash_thread_niceness = Integer(
        10,
        help="""Niceness added to the password-checking threads (Linux: per thread), so
        that the CPU goes to the hub's other work first when both want it. 0: none.""",
    ).tag(config=True)

    @default("hash_threads")
    def _hash_threads_default(self):
        return min(4, max(1, (os.cpu_count() or 1) // 4))
    max_waiting = Integer(
        32,
        help="""Password checks that may wait for a hashing thread at once; further
        logins are answered 503 (try again in a moment) without being checked.""",
    ).tag(config=True)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.executor = ThreadPoolExecutor(max_workers=max(1, self.hash_threads),
                                           thread_name_prefix="bai-login-hash",
                                           initializer=_lower_priority,
                                           initargs=(self.hash_thread_niceness,))
        self.accounts = SlidingWindow(self.failure_window, self.max_failures_per_account)
        self.addresses = SlidingWindow(self.failure_window, self.max_failures_per_address)
        self.in_flight = 0
        # A hash of a random password, of the same cost as the users' hashes.
        self.dummy_hash = bcrypt.hashpw(secrets.token_bytes(16),
                                        bcrypt.gensalt(rounds=BCRYPT_ROUNDS))

    @staticmethod
    def account_key(login: str, user_id: str | None) -> str:
        """One key per account, whichever login name (email, username) was typed."""
        return f"id:{user_id}" if user_id else "name:" + login.strip().lower()

    def check_address(self, address: str) -> None:
        """Raise 429 (with Retry-After) when ``address`` failed too often lately."""
        if self.max_failures_per_address > 0 and address:
            self._refuse("address", self.addresses.retry_after(address), address)

    def check_account(self, key: str, login: str, address: str) -> None:
        """Raise 429 (with Retry-After) when the account ``key`` failed too often lately."""
        if self.max_failures_per_account > 0:
            self._refuse("account", self.accounts.retry_after(key), address, login)

    def _refuse(self, by: str, wait: float, address: str, login: str = "") -> None:
        if not wait:
            return
        seconds = math.ceil(wait)
        THROTTLED.labels(by=by).inc()
        self.log.warning("login throttled (%s) for %r from %s: retry in %d s", by, login,
                         address, seconds)
        who = "this account" if by == "account" else "your address"
        err = web.HTTPError(
            429, f"Too many failed logins for {who}. Try again in {_duration(seconds)}.")
        err.headers = {"Retry-After": str(seconds)}  # JupyterHub's error page sends these
        raise err

    def failed(self, key: str, address: str) -> None:
        self.accounts.hit(key)
        if address:
            self.addresses.hit(address)

    def succeeded(self, key: str) -> None:
        self.accounts.clear(key)

    def _check(self, password: str, hashed: str | None) -> bool:
        against = "user" if is_bcrypt_hash(hashed) else "dummy"
        PASSWORD_CHECKS.labels(against=against).inc()
        try:
            ok = bcrypt.checkpw(password.encode(),
                                hashed.encode() if against == "user" else self.dummy_hash)
        except ValueError:  # e.g. a password longer than bcrypt takes: no match
            bcrypt.checkpw(b"", self.dummy_hash)
            ok = False
        return ok and against == "user"

    async def check_password(self, password: str, hashed: str | None) -> bool:
        """Whether ``password`` matches ``hashed``; with no (valid) hash, the same work
        against the dummy hash and False. Runs on the login pool."""
        if self.in_flight >= self.max_waiting + self.executor._max_workers:
            err = web.HTTPError(503, "Too many logins at once. Try again in a moment.")
            err.headers = {"Retry-After": "1"}
            raise err
        self.in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self.executor, self._check, password, hashed)
        finally:
            self.in_flight -= 1


def _lower_priority(niceness: int) -> None:
    """Make the calling thread nicer (Linux schedules threads as tasks)."""
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + niceness)
    except OSError:
        pass


def _duration(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def client_address(handler) -> str:
    """The client's address for throttling: the API's rule (trusted proxies) when
    available, else the socket's peer (never X-Real-Ip, which tornado's xheaders
    would have put in ``request.remote_ip``)."""
    try:
        from ..api.base import client_address as api_client_address
    except ImportError:  # pragma: no cover - the API module always has it
        api_client_address = None
    if api_client_address is not None:
        return api_client_address(handler)
    ctx = getattr(handler.request.connection, "context", None)
    address = getattr(ctx, "address", None)
    if isinstance(address, tuple) and address:
        return str(address[0])
    return getattr(ctx, "_orig_remote_ip", "") or handler.request.remote_ip or ""
