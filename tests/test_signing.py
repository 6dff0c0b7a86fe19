"""Backend.AI keypair request signing: the algorithm, and the hub's answers to signed requests.

Expected signatures are computed here, by hand from the specification (hmac and
hashlib), never by the code under test. The HTTP tests sign with that same
hand-written signer against a real hub (JupyterHub + CHP + the platform).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json as jsonlib
import shutil
import time
import urllib.parse
import uuid

import pytest
import requests

from jupyterhub_backendai.common import signing
from jupyterhub_backendai.common.errors import Unauthorized

from .hub import ADMIN_EMAIL, ADMIN_PASSWORD, Hub

API = "/hub/api/backendai"
VERSION = "v8.20240915"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def by_hand(secret: str, *, method: str, target: str, raw_date: str, day: str, host: str,
            ctype: str = "application/json", version: str = VERSION) -> str:
    """The signature, straight from the specification."""
    k_day = hmac.new(secret.encode(), day.encode(), hashlib.sha256).digest()
    k = hmac.new(k_day, host.encode(), hashlib.sha256).digest()
    msg = (f"{method}\n{target}\n{raw_date}\nhost:{host}\ncontent-type:{ctype}\n"
           f"x-backendai-version:{version}\n{EMPTY_SHA256}")
    return hmac.new(k, msg.encode(), hashlib.sha256).hexdigest()


# -- the algorithm -----------------------------------------------------------------------


def test_empty_body_hash_constant():
    assert hashlib.sha256(b"").hexdigest() == EMPTY_SHA256


def test_client_signature_matches_a_hand_computed_vector():
    date = dt.datetime(2026, 3, 14, 23, 59, 30, tzinfo=dt.UTC)
    headers = signing.sign_request(
        "get", "http://hub.example.org:8000/hub/api/backendai/users?offset=0&limit=5",
        "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", date=date,
    )
    raw_date = "2026-03-14T23:59:30+00:00"
    expected = by_hand(
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", method="GET",
        target="/hub/api/backendai/users?offset=0&limit=5", raw_date=raw_date, day="20260314",
        host="hub.example.org:8000",
    )
    assert headers == {
        "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential=AKIAIOSFODNN7EXAMPLE:{expected}",
        "Date": raw_date,
        "Content-Type": "application/json",
        "X-BackendAI-Version": VERSION,
    }


def test_body_is_not_signed_only_the_empty_hash():
    # A POST's signature is the same whatever its body: Backend.AI signs sha256(b"").
    date = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    h = signing.sign_request("POST", "http://h:1/x", "AK", "SK", date=date)
    sig = h["Authorization"].rsplit(":", 1)[1]
    assert sig == by_hand("SK", method="POST", target="/x", raw_date=h["Date"], day="20260102",
                          host="h:1")


def test_signed_body_adds_an_eighth_line_and_a_header():
    date = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    body = b'{"role": "user"}'
    h = signing.sign_request("PATCH", "http://h:1/x", "AK", "SK", date=date, body=body)
    digest = hashlib.sha256(body).hexdigest()
    assert h["X-BackendAI-Content-SHA256"] == digest
    k_day = hmac.new(b"SK", b"20260102", hashlib.sha256).digest()
    k = hmac.new(k_day, b"h:1", hashlib.sha256).digest()
    msg = (f"PATCH\n/x\n{h['Date']}\nhost:h:1\ncontent-type:application/json\n"
           f"x-backendai-version:{VERSION}\n{EMPTY_SHA256}\nx-backendai-content-sha256:{digest}")
    assert h["Authorization"].rsplit(":", 1)[1] == hmac.new(k, msg.encode(), hashlib.sha256).hexdigest()
    # The server accepts exactly that body, and refuses another one or a stripped header.
    headers = {**h, "Host": "h:1"}
    now = date + dt.timedelta(seconds=1)
    signing.verify_request("PATCH", "/x", headers, "SK", now=now, body=body)
    with pytest.raises(Unauthorized, match="does not match its signed hash"):
        signing.verify_request("PATCH", "/x", headers, "SK", now=now, body=b'{"role": "superadmin"}')
    stripped = {k: v for k, v in headers.items() if k != "X-BackendAI-Content-SHA256"}
    with pytest.raises(Unauthorized, match="signature mismatch"):
        signing.verify_request("PATCH", "/x", stripped, "SK", now=now, body=body)
    with pytest.raises(Unauthorized, match="64 hex digits"):
        signing.verify_request("PATCH", "/x", {**headers, "X-BackendAI-Content-SHA256": "zz"},
                               "SK", now=now, body=body)


def test_a_file_body_is_hashed_and_put_back():
    import io

    f = io.BytesIO(b"skip-these:" + b"payload")
    f.seek(11)
    assert signing.body_sha256(f) == hashlib.sha256(b"payload").hexdigest()
    assert f.tell() == 11
    assert signing.body_sha256("é") == hashlib.sha256("é".encode()).hexdigest()


@pytest.mark.parametrize("raw_date, day", [
    ("Sat, 14 Mar 2026 23:59:30 GMT", "20260314"),        # RFC 1123 (the Date header)
    ("2026-03-14T23:59:30Z", "20260314"),                 # ISO 8601
    ("20260314T23:59:30Z", "20260314"),                   # Backend.AI's documented form
    ("20260314T235930Z", "20260314"),                     # compact ISO 8601
    ("2026-03-15T08:59:30+09:00", "20260315"),            # the signing day is the date's own day
])
def test_server_verifies_hand_signed_requests_in_every_date_form(raw_date, day):
    now = dt.datetime(2026, 3, 14, 23, 59, 0, tzinfo=dt.UTC)
    sig = by_hand("secret", method="DELETE", target="/p/q?a=1&b=2", raw_date=raw_date, day=day,
                  host="127.0.0.1:9")
    headers = {"Authorization": f"BackendAI signMethod=HMAC-SHA256, credential=AKX:{sig}",
               "X-BackendAI-Date": raw_date, "Host": "127.0.0.1:9",
               "Content-Type": "application/json; charset=utf-8", "X-BackendAI-Version": VERSION}
    cred = signing.verify_request("DELETE", "/p/q?a=1&b=2", headers, "secret", now=now)
    assert (cred.access_key, cred.signature) == ("AKX", sig)


def _hand_headers(secret, *, date, target="/t", host="h:1", ak="AKX", method="GET"):
    raw = date.isoformat()
    sig = by_hand(secret, method=method, target=target, raw_date=raw,
                  day=date.strftime("%Y%m%d"), host=host)
    return {"Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={ak}:{sig}",
            "Date": raw, "Host": host, "Content-Type": "application/json",
            "X-BackendAI-Version": VERSION}


@pytest.mark.parametrize("offset_s, ok", [
    (0, True), (-899, True), (899, True), (-900, True), (900, True),
    (-901, False), (901, False), (-86400, False), (3600, False),
])
def test_clock_skew_boundary(offset_s, ok):
    now = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
    date = now + dt.timedelta(seconds=offset_s)
    headers = _hand_headers("s", date=date)
    if ok:
        signing.verify_request("GET", "/t", headers, "s", now=now)
    else:
        with pytest.raises(Unauthorized, match="too (old|in the future)"):
            signing.verify_request("GET", "/t", headers, "s", now=now)


@pytest.mark.parametrize("change, reason", [
    ({"target": "/t?x=1"}, "signature mismatch"),
    ({"target": "/u"}, "signature mismatch"),
    ({"method": "POST"}, "signature mismatch"),
    ({"host": "other:1"}, "signature mismatch"),
    ({"secret": "wrong"}, "signature mismatch"),
    ({"Content-Type": "text/plain"}, "signature mismatch"),
    ({"X-BackendAI-Version": "v4.20190315"}, "signature mismatch"),
])
def test_any_tampering_breaks_the_signature(change, reason):
    now = dt.datetime.now(dt.UTC)
    headers = _hand_headers("s", date=now)
    target, method, secret = "/t", "GET", "s"
    for k, v in change.items():
        if k == "target":
            target = v
        elif k == "method":
            method = v
        elif k == "secret":
            secret = v
        elif k == "host":
            headers["Host"] = v
        else:
            headers[k] = v
    with pytest.raises(Unauthorized, match=reason):
        signing.verify_request(method, target, headers, secret, now=now)


@pytest.mark.parametrize("auth, reason", [
    (None, "Authorization header is missing"),
    ("token abc", "malformed Authorization header"),
    ("BackendAI", "malformed Authorization header"),
    ("BackendAI signMethod=HMAC-SHA256", "signMethod and credential are required"),
    ("BackendAI signMethod=HMAC-MD5, credential=AK:" + "0" * 64, "unsupported signMethod"),
    ("BackendAI signMethod=HMAC-SHA256, credential=AK", "credential must be"),
    ("BackendAI signMethod=HMAC-SHA256, credential=AK:xyz", "64 hex digits"),
    ("BackendAI signMethod=HMAC-SHA256, credential", "bad parameter"),
])
def test_malformed_authorization_headers_have_reasons(auth, reason):
    with pytest.raises(Unauthorized, match=reason):
        signing.parse_authorization(auth)


def test_missing_or_bad_date_and_version_have_reasons():
    now = dt.datetime.now(dt.UTC)
    base = _hand_headers("s", date=now)
    no_date = {k: v for k, v in base.items() if k != "Date"}
    with pytest.raises(Unauthorized, match="Date or X-BackendAI-Date header is required"):
        signing.verify_request("GET", "/t", no_date, "s")
    with pytest.raises(Unauthorized, match="unparseable request date"):
        signing.verify_request("GET", "/t", {**base, "Date": "yesterday-ish"}, "s")
    no_version = {k: v for k, v in base.items() if k != "X-BackendAI-Version"}
    with pytest.raises(Unauthorized, match="X-BackendAI-Version header is required"):
        signing.verify_request("GET", "/t", no_version, "s")


# -- against a real hub ------------------------------------------------------------------


def hub_for(request, tmp_path_factory, kind: str, extra_env: dict | None = None):
    """A running hub on a fresh database of ``kind``, its superadmin keys on ``hub.admin_keys``."""
    from jupyterhub_backendai.cli import create_superadmin

    if kind == "sqlite":
        db_url = f"sqlite:///{tmp_path_factory.mktemp('db')}/backendai.sqlite"
    else:
        db_url = request.getfixturevalue("postgres").new_database("t_" + uuid.uuid4().hex[:12])
    admin = create_superadmin(db_url, ADMIN_EMAIL, ADMIN_PASSWORD)
    hub = Hub(db_url=db_url, backend="local", extra_env=extra_env)
    hub.admin_keys = (admin["access_key"], admin["secret_key"])
    try:
        try:
            hub.start()
        except Exception as e:
            raise RuntimeError(f"hub did not start: {e}\n{hub.log()}") from e
        yield hub
    finally:
        hub.close()
        shutil.rmtree(hub.dir, ignore_errors=True)


def signed(hub, method: str, path: str, ak: str, sk: str, *, json=None,
           date: dt.datetime | None = None, host: str | None = None, sign_path: str | None = None,
           sign_host: str | None = None, query: dict | None = None) -> requests.Response:
    """A request signed by hand (``sign_*`` sign something else than what is sent)."""
    target = API + path + ("?" + urllib.parse.urlencode(query) if query else "")
    host = host or urllib.parse.urlsplit(hub.base).netloc
    date = date or dt.datetime.now(dt.UTC)
    raw = date.isoformat()
    sig = by_hand(sk, method=method, target=sign_path or target, raw_date=raw,
                  day=date.strftime("%Y%m%d"), host=sign_host or host)
    headers = {"Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={ak}:{sig}",
               "Date": raw, "Host": host, "Content-Type": "application/json",
               "X-BackendAI-Version": VERSION}
    data = None if json is None else jsonlib.dumps(json)
    return requests.request(method, hub.base + target, headers=headers, data=data, timeout=60,
                            verify=getattr(hub, "verify", True))


def problem(r: requests.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["Content-Type"].startswith("application/problem+json")
    body = r.json()
    assert body["title"]
    return body["detail"]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    yield from hub_for(request, tmp_path_factory, request.param)


@pytest.fixture
def alice(hub):
    """A fresh user (made through the API) with the secret key shown once at creation."""
    name = "u" + uuid.uuid4().hex[:8]
    r = signed(hub, "POST", "/users", *hub.admin_keys, json={
        "email": f"{name}@example.com", "username": name, "password": "alice-pass-1",
        "role": "user", "domain_name": "default",
    })
    assert r.status_code == 201, r.text
    body = r.json()
    kp = body["keypair"]
    return {"id": body["id"], "username": name,
            "access_key": kp["access_key"], "secret_key": kp["secret_key"]}


def test_signed_request_is_accepted(hub, alice):
    r = signed(hub, "GET", "/whoami", alice["access_key"], alice["secret_key"])
    assert r.status_code == 200, r.text
    me = r.json()
    assert me["user"]["username"] == alice["username"]
    assert me["keypair"] == alice["access_key"]


def test_signed_post_with_a_body_is_accepted(hub, alice):
    r = signed(hub, "POST", "/keypairs", alice["access_key"], alice["secret_key"], json={})
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["access_key"].startswith("AKIA") and len(new["secret_key"]) == 40
    r = signed(hub, "GET", "/whoami", new["access_key"], new["secret_key"])
    assert r.status_code == 200, r.text
    assert r.json()["user"]["username"] == alice["username"]
    assert r.json()["keypair"] == new["access_key"]


@pytest.mark.parametrize("minutes", [-14, 14])
def test_dates_within_fifteen_minutes_are_accepted(hub, alice, minutes):
    date = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes)
    r = signed(hub, "GET", "/whoami", alice["access_key"], alice["secret_key"], date=date)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("minutes, word", [(-16, "old"), (16, "future"), (-24 * 60, "old")])
def test_replayed_or_skewed_dates_are_refused(hub, alice, minutes, word):
    date = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes)
    r = signed(hub, "GET", "/whoami", alice["access_key"], alice["secret_key"], date=date)
    assert word in problem(r, 401)


def test_replay_of_a_captured_request_after_the_window_is_refused(hub, alice):
    # A request captured 20 minutes ago, sent again verbatim.
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=20)
    r = signed(hub, "GET", "/whoami", alice["access_key"], alice["secret_key"], date=old)
    assert "too old" in problem(r, 401)


@pytest.mark.parametrize("tamper", ["path", "query", "host", "method"])
def test_tampered_requests_are_refused(hub, alice, tamper):
    ak, sk = alice["access_key"], alice["secret_key"]
    if tamper == "path":
        r = signed(hub, "GET", "/users", ak, sk, sign_path=API + "/whoami")
    elif tamper == "query":
        r = signed(hub, "GET", "/users", ak, sk, query={"limit": 5},
                   sign_path=API + "/users?limit=6")
    elif tamper == "host":
        r = signed(hub, "GET", "/whoami", ak, sk, sign_host="evil.example.org:443")
    else:
        # Signed as a GET, sent as a DELETE of the user's own keypair.
        date = dt.datetime.now(dt.UTC)
        target = f"{API}/keypairs/{ak}"
        host = urllib.parse.urlsplit(hub.base).netloc
        sig = by_hand(sk, method="GET", target=target, raw_date=date.isoformat(),
                      day=date.strftime("%Y%m%d"), host=host)
        r = requests.delete(hub.base + target, headers={
            "Authorization": f"BackendAI signMethod=HMAC-SHA256, credential={ak}:{sig}",
            "Date": date.isoformat(), "Content-Type": "application/json",
            "X-BackendAI-Version": VERSION})
    assert "signature mismatch" in problem(r, 401)
    # Nothing happened: the keypair still works.
    assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200


def test_wrong_secret_is_refused(hub, alice):
    r = signed(hub, "GET", "/whoami", alice["access_key"], "x" * 40)
    assert "signature mismatch" in problem(r, 401)


def test_unknown_access_key_is_refused(hub):
    r = signed(hub, "GET", "/whoami", "AKIAAAAAAAAAAAAAAAAA", "x" * 40)
    assert "unknown access key" in problem(r, 401)


def test_malformed_header_is_refused(hub):
    r = requests.get(hub.base + API + "/whoami", headers={
        "Authorization": "BackendAI signMethod=HMAC-SHA256, credential=nocolon",
        "Date": dt.datetime.now(dt.UTC).isoformat(), "X-BackendAI-Version": VERSION})
    assert "malformed Authorization header" in problem(r, 401)


def test_inactive_keypair_is_refused_at_once(hub, alice):
    ak, sk = alice["access_key"], alice["secret_key"]
    assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200  # now cached
    r = signed(hub, "PATCH", f"/keypairs/{ak}", *hub.admin_keys, json={"is_active": False})
    assert r.status_code == 200, r.text
    assert "inactive" in problem(signed(hub, "GET", "/whoami", ak, sk), 401)
    r = signed(hub, "PATCH", f"/keypairs/{ak}", *hub.admin_keys, json={"is_active": True})
    assert r.status_code == 200, r.text
    assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200


def test_inactive_user_is_refused(hub, alice):
    ak, sk = alice["access_key"], alice["secret_key"]
    assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200
    r = signed(hub, "PATCH", f"/users/{alice['id']}", *hub.admin_keys, json={"status": "inactive"})
    assert r.status_code == 200, r.text
    assert "not active" in problem(signed(hub, "GET", "/whoami", ak, sk), 401)


def test_inactive_domain_is_refused(hub):
    dom = "d" + uuid.uuid4().hex[:8]
    assert signed(hub, "POST", "/domains", *hub.admin_keys, json={"name": dom}).status_code == 201
    r = signed(hub, "POST", "/users", *hub.admin_keys, json={
        "email": f"{dom}@example.com", "username": dom, "password": "bob-pass-123",
        "domain_name": dom, "project_ids": []})
    assert r.status_code == 201, r.text
    kp = r.json()["keypair"]
    ak, sk = kp["access_key"], kp["secret_key"]
    assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200
    r = signed(hub, "PATCH", f"/domains/{dom}", *hub.admin_keys, json={"is_active": False})
    assert r.status_code == 200, r.text
    assert f"domain {dom!r} is not active" in problem(signed(hub, "GET", "/whoami", ak, sk), 401)


def test_usage_is_recorded_on_the_keypair(hub, alice):
    ak, sk = alice["access_key"], alice["secret_key"]
    for _ in range(3):
        assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200
    # Usage is written in batches (KeypairAuth.usage_flush_interval, 1 s by default).
    deadline = time.monotonic() + 10
    while True:
        kp = signed(hub, "GET", f"/keypairs/{ak}", *hub.admin_keys).json()
        if kp.get("num_queries", 0) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert kp["num_queries"] == 3
    assert kp["last_used"] is not None
    last = dt.datetime.fromisoformat(kp["last_used"])
    assert abs((dt.datetime.now(dt.UTC) - last).total_seconds()) < 60



def test_keypair_changes_apply_at_once_despite_the_lookup_cache(hub, alice):
    ak, sk = alice["access_key"], alice["secret_key"]
    r = signed(hub, "GET", "/whoami", ak, sk)
    assert r.headers["X-RateLimit-Limit"] == "1000"  # the default, now cached
    r = signed(hub, "PATCH", f"/keypairs/{ak}", *hub.admin_keys, json={"rate_limit": 777})
    assert r.status_code == 200, r.text
    assert signed(hub, "GET", "/whoami", ak, sk).headers["X-RateLimit-Limit"] == "777"


def test_allowed_client_ips_are_enforced(hub, alice):
    ak, sk = alice["access_key"], alice["secret_key"]
    path = f"/users/{alice['id']}"
    r = signed(hub, "PATCH", path, *hub.admin_keys, json={"allowed_client_ip": ["10.0.0.0/8"]})
    assert r.status_code == 200, r.text
    detail = problem(signed(hub, "GET", "/whoami", ak, sk), 401)
    assert "client address 127.0.0.1 is not allowed" in detail
    r = signed(hub, "PATCH", path, *hub.admin_keys,
               json={"allowed_client_ip": ["10.0.0.0/8", "127.0.0.1/32"]})
    assert r.status_code == 200, r.text
    assert signed(hub, "GET", "/whoami", ak, sk).status_code == 200
