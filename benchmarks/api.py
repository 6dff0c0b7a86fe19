"""Admin API throughput and latency: signed Backend.AI requests vs. JupyterHub's own API.

    python benchmarks/api.py [--duration S] [--rounds N] [--clients 1,10,50] [--postgres] [--redis]

It starts its own hub (tests/hub.py: the launcher, CHP, the in-process agent on the
local backend; SQLite, or with --postgres a throwaway PostgreSQL server; with --redis
a throwaway Redis for the event bus and the rate-limit windows, i.e. cluster mode's
stores) and, on loopback
through the proxy, measures requests/s and p50/p99 latency of:

  signed_get:   GET /hub/api/backendai/sessions of a user, signed with the user's
                keypair (Backend.AI HMAC-SHA256; a new Date and signature per request)
  keypair_post: POST /hub/api/backendai/keypairs (signed, by the same user; creates a keypair)
  hub_get:      GET /hub/api/user with the same user's JupyterHub API token (the baseline)
  token_get:    GET /hub/api/backendai/sessions with that token: the same API work as
                signed_get without the signature check, which separates the cost of
                keypair authentication from the cost of the endpoint

each under 1, 10 and 50 concurrent clients (asyncio + aiohttp, keep-alive, one
connection per client). Cells are measured for --duration seconds after a short
warm-up, and rounds interleave the operations so that load from elsewhere
hits all alike. Any non-2xx answer is counted as an error and reported. The user's
keypair gets a rate limit high enough not to interfere. The last line printed is
machine-readable (figures at 10 clients; p99 of the signed GET):

    signed_get_rps=<f> hub_get_rps=<f> ratio=<f> p99_ms=<f>

With --scenario login it measures instead the admin API's latency (a superadmin's
signed GET /hub/api/backendai/users, --admin-clients at once) idle and while 16
clients (--guessers) guess passwords at /hub/login as fast as they can. Login
throttling is switched off on that hub (LoginGuard.max_failures_per_* = 0), as if
every guess came from another address of a botnet: every guess costs a bcrypt
check, the worst case. Its last line:

    login_idle_p99_ms=<f> login_guessing_p99_ms=<f> ratio=<f> guesses_per_s=<f>

(the target: ratio <= 2).

Everything it starts (hub, proxy, temp dirs) is removed at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse

import aiohttp
import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jupyterhub_backendai.cli import create_superadmin  # noqa: E402
from jupyterhub_backendai.common import signing  # noqa: E402
from tests.hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub  # noqa: E402
from tests.services import Postgres, Redis  # noqa: E402

API = "/hub/api/backendai"
USER_EMAIL = "bench@example.com"
USER_PASSWORD = "bench-pass-123"
RATE_LIMIT = 2**31 - 1
OPERATIONS = ("signed_get", "token_get", "keypair_post", "hub_get")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def signed(base: str, method: str, path: str, ak: str, sk: str, json=None) -> requests.Response:
    url = base + API + path
    return requests.request(method, url, headers=signing.sign_request(method, url, ak, sk),
                            json=json, timeout=60)


class Bench:
    def __init__(self, hub: Hub, user: dict, token: str) -> None:
        self.hub = hub
        self.ak = user["keypair"]["access_key"]
        self.sk = user["keypair"]["secret_key"]
        self.user_id = user["id"]
        self.token = token

    def request_args(self, op: str) -> tuple[str, str, dict, bytes | None]:
        base = self.hub.base
        if op == "hub_get":
            return "GET", base + "/hub/api/user", {"Authorization": f"token {self.token}"}, None
        if op == "token_get":
            return ("GET", base + API + "/sessions", {"Authorization": f"token {self.token}"},
                    None)
        if op == "signed_get":
            url = base + API + "/sessions"
            return "GET", url, signing.sign_request("GET", url, self.ak, self.sk), None
        url = base + API + "/keypairs"
        return "POST", url, signing.sign_request("POST", url, self.ak, self.sk), b"{}"

    async def run_cell(self, op: str, clients: int, duration: float, warmup: float) -> dict:
        latencies: list[float] = []
        errors: dict[int, int] = {}
        start_measure = time.perf_counter() + warmup
        stop = start_measure + duration

        async def client(session: aiohttp.ClientSession) -> None:
            while True:
                method, url, headers, body = self.request_args(op)
                t0 = time.perf_counter()
                if t0 >= stop:
                    return
                async with session.request(method, url, headers=headers, data=body) as r:
                    await r.read()
                    status = r.status
                t1 = time.perf_counter()
                if t0 >= start_measure and t1 <= stop:
                    if 200 <= status < 300:
                        latencies.append(t1 - t0)
                    else:
                        errors[status] = errors.get(status, 0) + 1

        conns = [aiohttp.TCPConnector(limit=1, force_close=False) for _ in range(clients)]
        sessions = [aiohttp.ClientSession(connector=c, timeout=aiohttp.ClientTimeout(total=120))
                    for c in conns]
        try:
            await asyncio.gather(*(client(s) for s in sessions))
        finally:
            for s in sessions:
                await s.close()
        lat = sorted(latencies)
        n = len(lat)
        return {
            "op": op, "clients": clients, "n": n, "errors": errors,
            "rps": n / duration,
            "p50_ms": 1000 * statistics.median(lat) if n else float("nan"),
            "p99_ms": 1000 * lat[min(n - 1, int(0.99 * n))] if n else float("nan"),
        }


def setup(hub: Hub, admin_keys: tuple[str, str]) -> tuple[dict, str]:
    """A user with a keypair (high rate limit), a hub login and an API token, two sessions."""
    r = signed(hub.base, "POST", "/users", *admin_keys, json={
        "email": USER_EMAIL, "password": USER_PASSWORD, "username": "bench"})
    r.raise_for_status()
    user = r.json()
    r = signed(hub.base, "PATCH", f"/keypairs/{user['keypair']['access_key']}", *admin_keys,
               json={"rate_limit": RATE_LIMIT})
    r.raise_for_status()
    s = hub.login(USER_EMAIL, USER_PASSWORD)
    token = hub.token_for(s, "bench")
    ak, sk = user["keypair"]["access_key"], user["keypair"]["secret_key"]
    for i in range(2):
        r = signed(hub.base, "POST", "/sessions", ak, sk, json={
            "name": f"bench-{i}", "image": hub.image, "startup_command": "true",
            "resources": {"cpu": "0.1", "mem": "64m"}})
        if r.status_code != 201:
            log(f"(could not create a batch session: {r.status_code} {r.text[:200]})")
    return user, token


async def measure_admin(base: str, ak: str, sk: str, clients: int, duration: float,
                        warmup: float) -> dict:
    """Latency of signed GET /users by a superadmin, ``clients`` at once."""
    latencies: list[float] = []
    errors: dict[int, int] = {}
    start = time.perf_counter() + warmup
    stop = start + duration
    url = base + API + "/users?limit=20"

    async def client(session: aiohttp.ClientSession) -> None:
        while True:
            t0 = time.perf_counter()
            if t0 >= stop:
                return
            async with session.get(url, headers=signing.sign_request("GET", url, ak, sk)) as r:
                await r.read()
                status = r.status
            t1 = time.perf_counter()
            if t0 >= start and t1 <= stop:
                if status == 200:
                    latencies.append(t1 - t0)
                else:
                    errors[status] = errors.get(status, 0) + 1

    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
                for _ in range(clients)]
    try:
        await asyncio.gather(*(client(s) for s in sessions))
    finally:
        for s in sessions:
            await s.close()
    lat = sorted(latencies)
    n = len(lat)
    return {"n": n, "errors": errors,
            "p50_ms": 1000 * statistics.median(lat) if n else float("nan"),
            "p99_ms": 1000 * lat[min(n - 1, int(0.99 * n))] if n else float("nan")}


async def with_guessers(base: str, guessers: int, work) -> tuple[dict, dict[int, int], float]:
    """Run ``work`` (a coroutine) while ``guessers`` clients post wrong passwords to
    /hub/login as fast as they are answered; returns (its result, the guesses'
    statuses, guesses per second)."""
    statuses: dict[int, int] = {}
    done = asyncio.Event()

    async def guesser(k: int) -> None:
        jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1
        async with aiohttp.ClientSession(cookie_jar=jar) as s:
            async with s.get(base + "/hub/login") as r:
                await r.read()
            xsrf = next((c.value for c in jar if c.key == "_xsrf"), "")
            n = 0
            while not done.is_set():
                data = {"username": f"victim{k}-{n % 50}", "password": f"guess-{n}",
                        "_xsrf": xsrf}
                async with s.post(base + "/hub/login", data=data, allow_redirects=False) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                n += 1

    tasks = [asyncio.create_task(guesser(k)) for k in range(guessers)]
    await asyncio.sleep(1.0)  # let the guessing reach its pace
    t0 = time.perf_counter()
    before = sum(statuses.values())
    try:
        result = await work
    finally:
        elapsed = time.perf_counter() - t0
        made = sum(statuses.values()) - before
        done.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result, statuses, made / elapsed


def login_scenario(args) -> int:
    """The admin API's p99 idle vs while clients guess passwords (issue 10, row 10)."""
    hub = None
    tmp = tempfile.mkdtemp(prefix="bai-loginbench-")
    try:
        db_url = f"sqlite:///{tmp}/backendai.sqlite"
        admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
        hub = Hub(db_url=db_url, backend="local", extra_args=[
            "--LoginGuard.max_failures_per_account=0", "--LoginGuard.max_failures_per_address=0"])
        log(f"starting a hub on {hub.base} (sqlite; login throttling off)")
        hub.start()
        keys = (admin["access_key"], admin["secret_key"])
        r = signed(hub.base, "POST", "/users", *keys, json={
            "email": "bench-admin@example.com", "password": USER_PASSWORD,
            "username": "bench-admin", "role": "superadmin"})
        r.raise_for_status()
        kp = r.json()["keypair"]
        signed(hub.base, "PATCH", f"/keypairs/{kp['access_key']}", *keys,
               json={"rate_limit": RATE_LIMIT}).raise_for_status()
        ak, sk = kp["access_key"], kp["secret_key"]
        idle, busy, statuses, rates = [], [], {}, []
        for rnd in range(args.rounds):
            res = asyncio.run(measure_admin(hub.base, ak, sk, args.admin_clients,
                                            args.duration, args.warmup))
            idle.append(res)
            log(f"round {rnd + 1} idle     n={res['n']:6d} p50={res['p50_ms']:7.2f} ms "
                f"p99={res['p99_ms']:7.2f} ms errors={res['errors'] or 0}")
            res, st, rate = asyncio.run(with_guessers(
                hub.base, args.guessers,
                measure_admin(hub.base, ak, sk, args.admin_clients, args.duration, args.warmup)))
            busy.append(res)
            rates.append(rate)
            for k, v in st.items():
                statuses[k] = statuses.get(k, 0) + v
            log(f"round {rnd + 1} guessing n={res['n']:6d} p50={res['p50_ms']:7.2f} ms "
                f"p99={res['p99_ms']:7.2f} ms errors={res['errors'] or 0} "
                f"guesses/s={rate:.1f} answers={st}")
        i99 = statistics.median(x["p99_ms"] for x in idle)
        b99 = statistics.median(x["p99_ms"] for x in busy)
        i50 = statistics.median(x["p50_ms"] for x in idle)
        b50 = statistics.median(x["p50_ms"] for x in busy)
        gps = statistics.median(rates)
        print(f"hub: JupyterHub + CHP + platform, sqlite, local backend; login throttling off; "
              f"{args.rounds} round(s) of {args.duration:g} s; {args.admin_clients} admin "
              f"client(s), {args.guessers} guessers; "
              f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
        print("| admin API (signed GET /users) | p50 (ms) | p99 (ms) |")
        print("|---|---|---|")
        print(f"| idle | {i50:.2f} | {i99:.2f} |")
        print(f"| while {args.guessers} clients guess passwords ({gps:.1f} guesses/s, answers "
              f"{dict(sorted(statuses.items()))}) | {b50:.2f} | {b99:.2f} |")
        print(f"login_idle_p99_ms={i99:.2f} login_guessing_p99_ms={b99:.2f} "
              f"ratio={b99 / i99:.3f} guesses_per_s={gps:.1f}")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if hub is not None:
            hub.close()
            shutil.rmtree(hub.dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", choices=["throughput", "login"], default="throughput",
                    help="throughput: the operations table; login: the admin API's p99 idle "
                    "vs while clients guess passwords")
    ap.add_argument("--guessers", type=int, default=16, help="(login) password-guessing clients")
    ap.add_argument("--admin-clients", type=int, default=1,
                    help="(login) concurrent admin API clients measured")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per cell")
    ap.add_argument("--clients", default="1,10,50", help="concurrency levels")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds over all cells; figures are the median over rounds")
    ap.add_argument("--postgres", action="store_true",
                    help="run the hub on a throwaway PostgreSQL server (default: SQLite)")
    ap.add_argument("--redis", action="store_true",
                    help="give the hub a throwaway Redis (event bus, rate-limit windows)")
    args = ap.parse_args(argv)
    if args.scenario == "login":
        return login_scenario(args)
    levels = [int(x) for x in args.clients.split(",")]
    if 10 not in levels:
        ap.error("--clients must include 10 (the summary line's figures)")

    hub = None
    services: list = []
    tmp = tempfile.mkdtemp(prefix="bai-apibench-")
    try:
        env = {}
        if args.postgres:
            services.append(Postgres())
            db_url = services[-1].new_database("apibench")
        else:
            db_url = f"sqlite:///{tmp}/backendai.sqlite"
        if args.redis:
            services.append(Redis())
            env["BACKENDAI_REDIS_URL"] = services[-1].url
        admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
        if not admin.get("created"):
            sys.exit("the database already has a superadmin: give an empty database")
        hub = Hub(db_url=db_url, backend="local", extra_env=env)
        stores = urllib.parse.urlsplit(db_url).scheme.split("+")[0] + (
            " + redis" if args.redis else "")
        log(f"starting a hub on {hub.base} ({stores})")
        hub.start()
        user, token = setup(hub, (admin["access_key"], admin["secret_key"]))
        bench = Bench(hub, user, token)
        results: dict[tuple[str, int], list[dict]] = {}
        for rnd in range(args.rounds):
            for clients in levels:
                for op in OPERATIONS:
                    res = asyncio.run(bench.run_cell(op, clients, args.duration, args.warmup))
                    results.setdefault((op, clients), []).append(res)
                    log(f"round {rnd + 1} {op:12s} clients={clients:3d} n={res['n']:6d} "
                        f"rps={res['rps']:8.1f} p50={res['p50_ms']:7.2f} ms "
                        f"p99={res['p99_ms']:7.2f} ms errors={res['errors'] or 0}")

        def med(op: str, clients: int, key: str) -> float:
            return statistics.median(r[key] for r in results[(op, clients)])

        print(f"hub: JupyterHub + CHP + platform, {stores}, "
              f"local backend; {args.rounds} round(s) of {args.duration:g} s per cell; "
              f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
        print("| operation | clients | req/s | p50 (ms) | p99 (ms) | errors |")
        print("|---|---|---|---|---|---|")
        for op in OPERATIONS:
            for clients in levels:
                errs = sum(sum(r["errors"].values()) for r in results[(op, clients)])
                print(f"| {op} | {clients} | {med(op, clients, 'rps'):.1f} | "
                      f"{med(op, clients, 'p50_ms'):.2f} | {med(op, clients, 'p99_ms'):.2f} | {errs} |")
        sg, hg = med("signed_get", 10, "rps"), med("hub_get", 10, "rps")
        print(f"signed_get_rps={sg:.1f} hub_get_rps={hg:.1f} ratio={sg / hg:.3f} "
              f"p99_ms={med('signed_get', 10, 'p99_ms'):.2f}")
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if hub is not None:
            hub.close()
            shutil.rmtree(hub.dir, ignore_errors=True)
        for svc in services:
            svc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
