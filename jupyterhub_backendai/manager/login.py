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
- **Throttling the guesser, not the door.** Failures are counted in sliding windows of
  ``failure_window`` seconds: per (account, client address) pair, per account and per
  client address (the account is the user, whether named by email or username; a name
  without a user, lowercased; the address is the socket peer, or X-Forwarded-For when the
  request came through the packaged proxy or a trusted one:
  :func:`jupyterhub_backendai.common.clientaddr.client_address`).
  Only a pair is ever refused: after ``max_failures_per_account`` failures of one account
  from one address, that address's attempts on that account get 429 with ``Retry-After``
  for ``backoff`` seconds, doubled with each further failure (at most the window), before
  any password is checked. An account guessed at from many addresses
  (``max_failures_per_account`` in all), and an address that guessed at many accounts
  (``max_failures_per_address``), only make other attempts on them *slower*
  (``slow_down`` seconds before the check): a correct password of an account that an
  address did not guess at is never refused, so neither a user nor a superadmin can be
  locked out by someone else's guessing. A successful login clears its pair and its
  account's window; ``DELETE /hub/api/backendai/login-throttles`` (superadmins) clears
  what an address or an account has collected. The windows live in the hub process
  (JupyterHub runs one).
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

from ..common.clientaddr import client_address as _client_address

PASSWORD_CHECKS = Counter(
    "backendai_login_password_checks",
    "Password checks of logins: against a user's hash, or a dummy hash for login names "
    "without one (the same work, so timing does not enumerate users)",
    ["against"],
)
THROTTLED = Counter(
    "backendai_login_throttled",
    "Logins refused with 429 before any password check (too many recent failures of "
    "that account from that address)",
    ["by"],
)
SLOWED = Counter(
    "backendai_login_slowed",
    "Logins made to wait slow_down seconds before their check (their account, or their "
    "address, has many recent failures), never refused for it",
    ["by"],
)
BCRYPT_ROUNDS = 10  # tenancy.hash_password's cost; the dummy hash must cost the same


def is_bcrypt_hash(value: str | None) -> bool:
    return bool(value) and len(value) == 60 and value.startswith(("$2a$", "$2b$", "$2y$"))


class SlidingWindow:
    """Failure times per key within the last ``window`` seconds (thread-safe)."""

    def __init__(self, window: float, limit: int, max_keys: int = 100_000,
                 keep: int | None = None) -> None:
        self.window = window
        self.limit = limit
        self.max_keys = max_keys
        self.keep = max(keep if keep is not None else limit, 1)  # failures remembered
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
                q = self._hits[key] = collections.deque(maxlen=self.keep)
                while len(self._hits) > self.max_keys:  # forget the least recently failed
                    self._hits.popitem(last=False)
            self._hits.move_to_end(key)
            q.append(now)

    def count(self, key: str, now: float | None = None) -> tuple[int, float]:
        """(failures of ``key`` in the window, time of the newest)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            q = self._prune(key, now)
            return (0, 0.0) if q is None else (len(q), q[-1])

    def clear(self, key: str) -> None:
        with self._lock:
            self._hits.pop(key, None)

    def clear_where(self, match) -> int:
        """Forget every key for which ``match(key)`` holds; how many."""
        with self._lock:
            keys = [k for k in self._hits if match(k)]
            for k in keys:
                del self._hits[k]
            return len(keys)


class LoginGuard(LoggingConfigurable):
    """Throttling and password checks of the hub's login (see the module's doc)."""

    max_failures_per_account = Integer(
        10,
        help="""Failed logins of one account from one client address within
        failure_window seconds after which that address's attempts on that account are
        refused with 429 for ``backoff`` seconds, doubled with each further failure (at
        most failure_window). The same number of failures of the account from all
        addresses together makes every other attempt on it wait slow_down seconds (never
        refused). 0: no per-account throttling.""",
    ).tag(config=True)
    max_failures_per_address = Integer(
        30,
        help="""Failed logins from one client address (any accounts) within failure_window
        seconds after which its attempts on accounts it has not failed on wait slow_down
        seconds first: a sprayer is slowed, a correct password is never refused for it.
        0: no per-address slowing.""",
    ).tag(config=True)
    failure_window = Float(
        300.0,
        help="Seconds of the sliding windows in which failed logins are counted.",
    ).tag(config=True)
    backoff = Float(
        5.0,
        help="""Seconds a (account, address) pair over max_failures_per_account waits
        after its latest failure; doubled with each further failure, at most
        failure_window.""",
    ).tag(config=True)
    slow_down = Float(
        2.0,
        help="""Seconds an attempt waits before its password is checked when its account
        (from all addresses) or its address (on all accounts) has too many recent
        failures.""",
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
        # Pairs remember enough failures for the doubling to reach the window.
        doublings = max(int(math.log2(max(self.failure_window / max(self.backoff, 0.001), 1))) + 2, 1)
        self.pairs = SlidingWindow(self.failure_window, self.max_failures_per_account,
                                   keep=self.max_failures_per_account + doublings)
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

    @staticmethod
    def _pair(key: str, address: str) -> str:
        return f"{key}\n{address}"

    def check_account(self, key: str, login: str, address: str) -> None:
        """Raise 429 (with Retry-After) while this address's failures on the account
        ``key`` keep it waiting (only the pair: never the account or the address as a
        whole)."""
        limit = self.max_failures_per_account
        if limit <= 0:
            return
        n, last = self.pairs.count(self._pair(key, address))
        if n < limit:
            return
        wait = min(self.backoff * 2 ** (n - limit), self.failure_window)
        self._refuse(last + wait - time.monotonic(), address, login)

    async def slow_down_if_hot(self, key: str, address: str) -> None:
        """Wait ``slow_down`` seconds before the check when the account (from all
        addresses) or the address (on all accounts) failed too often lately: slower,
        never refused."""
        if self.slow_down <= 0:
            return
        by = None
        if self.max_failures_per_account > 0 and \
                self.accounts.count(key)[0] >= self.max_failures_per_account:
            by = "account"
        elif address and self.max_failures_per_address > 0 and \
                self.addresses.count(address)[0] >= self.max_failures_per_address:
            by = "address"
        if by is not None:
            SLOWED.labels(by=by).inc()
            await asyncio.sleep(self.slow_down)

    def _refuse(self, wait: float, address: str, login: str = "") -> None:
        if wait <= 0:
            return
        seconds = math.ceil(wait)
        THROTTLED.labels(by="account").inc()
        self.log.warning("login throttled for %r from %s: retry in %d s", login, address, seconds)
        err = web.HTTPError(
            429, "Too many failed logins for this account from your address. "
                 f"Try again in {_duration(seconds)}.")
        err.headers = {"Retry-After": str(seconds)}  # JupyterHub's error page sends these
        raise err

    def failed(self, key: str, address: str) -> None:
        self.accounts.hit(key)
        self.pairs.hit(self._pair(key, address))
        if address:
            self.addresses.hit(address)

    def succeeded(self, key: str, address: str = "") -> None:
        self.accounts.clear(key)
        self.pairs.clear(self._pair(key, address))

    def clear(self, *, address: str | None = None, key: str | None = None) -> int:
        """Forget the failures of an address and/or an account (an admin's command);
        how many windows were cleared."""
        n = 0
        if address:
            n += self.addresses.clear_where(lambda k: k == address)
            n += self.pairs.clear_where(lambda k: k.rpartition("\n")[2] == address)
        if key:
            n += self.accounts.clear_where(lambda k: k == key)
            n += self.pairs.clear_where(lambda k: k.partition("\n")[0] == key)
        return n

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
    """The client's address for throttling: the hub's one rule
    (:func:`jupyterhub_backendai.common.clientaddr.client_address`)."""
    return _client_address(handler)
