"""Issue 10 row 10 and issue 22 row 6: login that cannot be used against others,
attacked on a real hub.

Password guessing gets a 429 with Retry-After that doubles with each further failure,
for the guessing (account, address) pair only: the account's owner from elsewhere, and
every other account from the guessing address, still log in (slowed when the account or
the address is hot, counted by the hub's Prometheus counter, never refused); a
superadmin clears a throttle at once. An unknown login name costs the same bcrypt work as
a known one (counted, not timed), and the admin API keeps answering while 16 clients
guess. Client addresses come from the socket, or from X-Forwarded-For only when the
request came through the hub's own proxy (configurable-http-proxy, told apart by its
secret: tests/test_client_address.py). The tests log in through the real proxy from
loopback addresses of their own (127.0.0.0/8 is all this host), which gives each test
its own client address; the last tests show that a client cannot choose its address
through the real proxy.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import uuid

import pytest
import requests

from jupyterhub_backendai import cli

from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

ACCOUNT_LIMIT = 4
ADDRESS_LIMIT = 8
WINDOW = 600
BACKOFF = 60  # seconds: a throttle outlasts any test step, however loaded the machine
FAST_BACKOFF = 3  # for the test that waits the doubling out (its own hub)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    if request.param == "sqlite":
        db_url = f"sqlite:///{tmp_path_factory.mktemp('db')}/backendai.sqlite"
    else:
        db_url = request.getfixturevalue("postgres").new_database("t_" + uuid.uuid4().hex[:12])
    for hub in _guarded_hub(db_url):
        hub.admin_token  # logged in before any test spends loopback's failures  # noqa: B018
        yield hub


def _guarded_hub(db_url: str, extra_env=None, backoff: float = BACKOFF):
    """A started hub with this module's login limits (a generator: stops it after)."""
    cli.create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
    hub = Hub(db_url=db_url, backend="local", extra_env=extra_env, extra_args=[
        f"--LoginGuard.max_failures_per_account={ACCOUNT_LIMIT}",
        f"--LoginGuard.max_failures_per_address={ADDRESS_LIMIT}",
        f"--LoginGuard.failure_window={WINDOW}",
        f"--LoginGuard.backoff={backoff}",
        "--LoginGuard.slow_down=0.2",
    ])
    try:
        hub.start()
        yield hub
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)


def new_user(hub) -> tuple[str, str]:
    name = "g" + uuid.uuid4().hex[:8]
    assert cli.main(["--db", hub.db_url, "create-user", "--email", f"{name}@example.com",
                     "--password", f"{name}-right-pass"]) == 0
    return name, f"{name}-right-pass"


def login(hub, name: str, password: str, address: str | None = None) -> requests.Response:
    """POST /hub/login through the proxy, from 127.0.0.1 or (``address``, a loopback
    address) from that local address."""
    from .test_client_address import client

    s = client(address) if address is not None else requests.Session()
    s.get(hub.base + "/hub/login", timeout=60)
    return s.post(hub.base + "/hub/login", allow_redirects=False, timeout=60,
                  data={"username": name, "password": password,
                        "_xsrf": s.cookies.get("_xsrf", path="/hub/")})


def refused(r: requests.Response) -> bool:
    return r.status_code == 403 and "Invalid username or password" in r.text


def succeeded(r: requests.Response) -> bool:
    return r.status_code == 302 and r.headers["Location"].endswith("/hub/spawn")


def throttled(r: requests.Response, who: str) -> int:
    """The Retry-After of a 429 that says who is throttled, in plain words."""
    assert r.status_code == 429, (r.status_code, r.text[-500:])
    wait = int(r.headers["Retry-After"])
    assert 0 < wait <= WINDOW
    text = re.sub(r"\s+", " ", r.text)
    assert f"Too many failed logins for {who}. Try again in " in text, text[-2000:]
    return wait


def slowed(hub) -> dict[str, float]:
    """The hub's counter of logins made to wait (never refused), by why."""
    r = requests.get(hub.base + "/hub/metrics", timeout=60,
                     headers={"Authorization": f"token {hub.admin_token}"})
    r.raise_for_status()
    out = {"account": 0.0, "address": 0.0}
    for m in re.finditer(r'^backendai_login_slowed_total\{by="(\w+)"\} (\S+)$', r.text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def clear(hub, token: str | None = None, **params) -> requests.Response:
    return requests.delete(hub.base + "/hub/api/backendai/login-throttles", params=params,
                           timeout=60, headers={"Authorization": f"token {token or hub.admin_token}"})


def checks(hub) -> dict[str, float]:
    """The hub's counter of password checks, by what they were checked against."""
    r = requests.get(hub.base + "/hub/metrics", timeout=60,
                     headers={"Authorization": f"token {hub.admin_token}"})
    r.raise_for_status()
    out = {"user": 0.0, "dummy": 0.0}
    for m in re.finditer(r'^backendai_login_password_checks_total\{against="(\w+)"\} (\S+)$',
                         r.text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def test_guessing_one_accounts_password_throttles_the_guesser_not_the_owner(hub):

    name, right = new_user(hub)
    addr = "127.1.0.1"
    for i in range(ACCOUNT_LIMIT):
        assert refused(login(hub, name, f"guess-{i}", addr)), i
    before = checks(hub)
    throttled(login(hub, name, "guess-x", addr), "this account from your address")
    # Refused before any password is checked: the right one too, from that address.
    throttled(login(hub, name, right, addr), "this account from your address")
    assert checks(hub) == before
    # The owner, from elsewhere (by email too), is not locked out: slowed, as the
    # account is hot, but let in.
    s0 = slowed(hub)
    assert succeeded(login(hub, f"{name}@example.com", right, "127.1.0.2"))
    assert slowed(hub)["account"] == s0["account"] + 1
    # ...which does not free the guesser.
    throttled(login(hub, name, right, addr), "this account from your address")
    # Other accounts from the same address are not affected.
    other, other_pw = new_user(hub)
    assert succeeded(login(hub, other, other_pw, addr))


@pytest.fixture
def fast_hub(tmp_path):
    """A hub whose throttled pairs wait FAST_BACKOFF seconds (then doubling)."""
    yield from _guarded_hub(f"sqlite:///{tmp_path}/backendai.sqlite", backoff=FAST_BACKOFF)


def test_the_guessers_wait_doubles_with_each_further_failure(fast_hub):
    import time

    hub = fast_hub
    name, right = new_user(hub)
    addr = "127.7.0.1"
    for i in range(ACCOUNT_LIMIT):
        assert refused(login(hub, name, f"guess-{i}", addr)), i
    throttled(login(hub, name, right, addr), "this account from your address")
    deadline = time.monotonic() + 30
    while (r := login(hub, name, "guess-y", addr)).status_code == 429:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert refused(r)  # one more guess after the wait: checked, wrong
    wait = throttled(login(hub, name, right, addr), "this account from your address")
    # Doubled: more than one backoff is left (up to FAST_BACKOFF seconds of a slow
    # machine between the failure and this request are allowed for).
    assert FAST_BACKOFF < wait <= 2 * FAST_BACKOFF, wait


def test_a_superadmin_clears_a_throttle(hub):
    name, right = new_user(hub)
    addr = "127.6.0.1"
    for i in range(ACCOUNT_LIMIT):
        assert refused(login(hub, name, f"guess-{i}", addr)), i
    throttled(login(hub, name, right, addr), "this account from your address")
    # Not for anyone else; and a clear names what it clears.
    other, other_pw = new_user(hub)
    token = hub.token_for(hub.login(other, other_pw), other)
    r = clear(hub, token, address=addr)
    assert r.status_code == 403 and "superadmins may" in r.json()["detail"], r.text
    r = clear(hub)
    assert r.status_code == 400 and "name what to clear" in r.json()["detail"], r.text
    r = clear(hub, nonsense="x")
    assert r.status_code == 400, r.text
    throttled(login(hub, name, right, addr), "this account from your address")
    assert clear(hub, address=addr).status_code == 204
    assert succeeded(login(hub, name, right, addr))
    # By account (its email or its name), from every address at once.
    for a in ("127.6.0.2", "127.6.0.3"):
        for i in range(ACCOUNT_LIMIT):
            assert refused(login(hub, name, f"again-{i}", a)), i
        throttled(login(hub, name, right, a), "this account from your address")
    assert clear(hub, login=f"{name}@example.com").status_code == 204
    for a in ("127.6.0.2", "127.6.0.3"):
        assert succeeded(login(hub, name, right, a))


def test_spraying_from_one_address_slows_it_and_locks_nobody_out(hub):
    name, right = new_user(hub)
    addr = "127.2.0.1"
    for i in range(ADDRESS_LIMIT):  # a different (unknown) account each time
        assert refused(login(hub, f"nobody-{i}-{uuid.uuid4().hex[:6]}", "guess", addr)), i
    s0 = slowed(hub)
    # An account the address did not guess at: its right password is slowed, not refused.
    assert succeeded(login(hub, name, right, addr))
    assert slowed(hub)["address"] == s0["address"] + 1
    other, other_pw = new_user(hub)
    assert succeeded(login(hub, other, other_pw, "127.2.0.2"))  # elsewhere: not slowed
    assert slowed(hub)["address"] == s0["address"] + 1


def test_success_clears_the_accounts_failures(hub):
    name, right = new_user(hub)
    for i in range(ACCOUNT_LIMIT - 1):
        assert refused(login(hub, name, f"typo-{i}", "127.3.0.1"))
    assert succeeded(login(hub, name, right, "127.3.0.1"))
    for i in range(ACCOUNT_LIMIT - 1):  # a fresh window: these would be too many otherwise
        assert refused(login(hub, name, f"typo-again-{i}", "127.3.0.2"))
    assert succeeded(login(hub, name, right, "127.3.0.2"))


def test_unknown_and_known_users_take_the_same_path(hub):
    name, _right = new_user(hub)
    c0 = checks(hub)
    known = login(hub, name, "wrong-password", "127.4.0.1")
    c1 = checks(hub)
    unknown = login(hub, "no-such-" + name, "wrong-password", "127.4.0.2")
    c2 = checks(hub)
    # One bcrypt check each: against the user's hash, and against the dummy hash.
    assert (c1["user"] - c0["user"], c1["dummy"] - c0["dummy"]) == (1, 0)
    assert (c2["user"] - c1["user"], c2["dummy"] - c1["dummy"]) == (0, 1)
    # And the same answer.
    assert refused(known) and refused(unknown)
    assert known.status_code == unknown.status_code
    def page(r, login):  # the page without the login name and the per-request xsrf token
        return re.sub(r"[A-Za-z0-9+/=|_-]{40,}", "TOKEN", r.text.replace(login, "X"))

    assert page(known, name) == page(unknown, "no-such-" + name)


def test_the_admin_api_answers_while_16_clients_guess(hub):
    stop = threading.Event()
    answers: list[int] = []
    lock = threading.Lock()

    def guesser(k: int) -> None:
        n = 0
        while not stop.is_set():
            # A new address and account each time: never throttled, so every guess
            # costs a bcrypt check (the worst case for the hub).
            r = login(hub, f"victim-{k}-{n}", "guess", f"127.5.{k}.{n % 250 + 1}")
            with lock:
                answers.append(r.status_code)
            n += 1

    threads = [threading.Thread(target=guesser, args=(k,), daemon=True) for k in range(16)]
    for t in threads:
        t.start()
    try:
        c0 = checks(hub)
        for _ in range(10):
            r = hub.api("GET", "/users")
            assert r.status_code == 200 and "admin" in {u["name"] for u in r.json()}
            r = requests.get(hub.base + "/hub/api/backendai/users", timeout=60,
                             headers={"Authorization": f"token {hub.admin_token}"})
            assert r.status_code == 200 and r.json()["total"] >= 1
        assert all(t.is_alive() for t in threads)  # the guessing went on meanwhile
        # ...and reached the hub's password checks: the admin API's 20 answers may all
        # come back before the first guess's bcrypt check ends (seen under load).
        deadline = time.monotonic() + 60
        while checks(hub)["dummy"] <= c0["dummy"]:
            assert time.monotonic() < deadline, "no guess reached a password check"
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert answers and set(answers) == {403}, sorted(set(answers))


def test_a_client_cannot_choose_its_address_through_the_proxy(hub):
    """X-Forwarded-For sent to the proxy is the client's word: the proxy appends the
    real peer, and that is the address counted (this spends loopback's failures)."""
    def spoofed_login(name, password, i):
        # The same spoofed headers on the form's GET (JupyterHub ties an anonymous xsrf
        # token to the address tornado sees) and on the POST.
        headers = {"X-Forwarded-For": f"192.0.2.{i + 1}", "X-Real-Ip": f"198.51.100.{i + 1}"}
        s = requests.Session()
        s.get(hub.base + "/hub/login", headers=headers, timeout=60)
        return s.post(hub.base + "/hub/login", headers=headers, allow_redirects=False,
                      timeout=60, data={"username": name, "password": password,
                                        "_xsrf": s.cookies.get("_xsrf", path="/hub/")})

    for i in range(ADDRESS_LIMIT):
        resp = spoofed_login(f"spoof-{i}-{uuid.uuid4().hex[:6]}", "x", i)
        assert refused(resp), (i, re.findall(r"login_error\">([^<]*)", resp.text))
    # Every failure was loopback's (the real peer): the next login from "another" spoofed
    # address is slowed as loopback's (and let in: spraying locks nobody out).
    name, right = new_user(hub)
    s0 = slowed(hub)
    assert succeeded(spoofed_login(name, right, 99))
    assert slowed(hub)["address"] == s0["address"] + 1


@pytest.fixture(scope="module")
def front_hub(tmp_path_factory):
    db_url = f"sqlite:///{tmp_path_factory.mktemp('front')}/backendai.sqlite"
    yield from _guarded_hub(db_url, {"BACKENDAI_APP_FRONT": "nginx"})


def _login_from(hub, source: str, name: str, password: str) -> tuple[int, str]:
    """POST /hub/login from the local address ``source`` (127.0.0.0/8 is all loopback),
    with spoofed X-Forwarded-For and X-Real-Ip headers: (status, body)."""
    import http.client
    import urllib.parse

    spoof = {"X-Forwarded-For": "192.0.2.7", "X-Real-Ip": "198.51.100.7"}

    def request(method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=60,
                                       source_address=(source, 0))
        c.request(method, path, body=body, headers={**spoof, **(headers or {})})
        r = c.getresponse()
        out = (r.status, r.getheader("Set-Cookie") or "", r.read().decode(errors="replace"))
        c.close()
        return out

    _, cookie, _ = request("GET", "/hub/login")
    xsrf = re.search(r"_xsrf=([^;]+)", cookie).group(1)
    status, _, text = request("POST", "/hub/login", urllib.parse.urlencode(
        {"username": name, "password": password, "_xsrf": xsrf}), {
        "Content-Type": "application/x-www-form-urlencoded", "Cookie": f"_xsrf={xsrf}"})
    return status, text


def test_behind_the_app_front_the_client_address_is_the_clients(front_hub):
    """nginx appends the client's address, then CHP nginx's: with the front the packaged
    config believes two entries. Failures from 127.0.0.2 (spoofed headers and all) slow
    127.0.0.2 down and not 127.0.0.3; with one hop believed, every client would be nginx's
    127.0.0.1 and share one budget."""
    for i in range(ADDRESS_LIMIT):
        status, _ = _login_from(front_hub, "127.0.0.2", f"nobody-{i}-{uuid.uuid4().hex[:6]}", "x")
        assert status == 403, status
    name, right = new_user(front_hub)
    s0 = slowed(front_hub)
    status, _ = _login_from(front_hub, "127.0.0.2", name, right)
    assert status == 302, status
    assert slowed(front_hub)["address"] == s0["address"] + 1  # 127.0.0.2's failures
    status, _ = _login_from(front_hub, "127.0.0.3", name, right)
    assert status == 302, status
    assert slowed(front_hub)["address"] == s0["address"] + 1  # not 127.0.0.3's
