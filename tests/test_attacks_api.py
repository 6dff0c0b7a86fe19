"""Attacks on the admin API's authentication, performed against a real hub, now refused.

- a captured signed request replayed verbatim, and its headers sent again with another
  body (issue 10, row 2);
- a JupyterHub token used to get past the rate limit of the user's keypair (row 5);
- ``allowed_client_ip`` dodged with ``X-Forwarded-For`` / ``X-Real-Ip``, or by using a
  token or the login cookie instead of a signature (row 6);
- JSON bodies too deep or too big, and schema errors that quoted regexes (row 14).

One hub per database (SQLite, PostgreSQL), shared by the module.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid

import pytest
import requests

from jupyterhub_backendai.common import signing

from .test_signing import API, hub_for, problem, signed


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    yield from hub_for(request, tmp_path_factory, request.param)


def new_user(hub, **extra) -> dict:
    name = "u" + uuid.uuid4().hex[:8]
    r = signed(hub, "POST", "/users", *hub.admin_keys, json={
        "email": f"{name}@example.com", "username": name, "password": "victim-pass-1",
        "role": "user", "domain_name": "default", **extra,
    })
    assert r.status_code == 201, r.text
    body = r.json()
    return {"id": body["id"], "username": name, "email": f"{name}@example.com",
            "access_key": body["keypair"]["access_key"],
            "secret_key": body["keypair"]["secret_key"]}


def prepared(hub, method: str, path: str, ak: str, sk: str, body, *, sign_body: bool):
    """(url, headers, data) of a request signed with the project's signer, ready to send
    (and to capture: an attacker who sees it on the wire has exactly these)."""
    url = hub.base + API + path
    data = json.dumps(body).encode()
    headers = signing.sign_request(method, url, ak, sk, body=data if sign_body else None)
    return url, headers, data


def send(method, url, headers, data) -> requests.Response:
    return requests.request(method, url, headers=headers, data=data, timeout=60)


def user_record(hub, uid: str) -> dict:
    r = signed(hub, "GET", f"/users/{uid}", *hub.admin_keys)
    assert r.status_code == 200, r.text
    return r.json()


def keypairs_of(hub, user: dict) -> list[str]:
    r = signed(hub, "GET", "/keypairs", *hub.admin_keys, query={"user_id": user["id"]})
    if r.status_code == 400:  # no such filter: list everything and pick the user's
        r = signed(hub, "GET", "/keypairs", *hub.admin_keys, query={"limit": 1000})
    assert r.status_code == 200, r.text
    return sorted(k["access_key"] for k in r.json()["items"] if k["user_id"] == user["id"])


# -- row 2: replay and re-targeting ------------------------------------------------------


@pytest.mark.parametrize("sign_body", [True, False], ids=["body-signed", "backendai-form"])
def test_replayed_signed_request_is_refused(hub, sign_body):
    alice = new_user(hub)
    before = keypairs_of(hub, alice)
    req = prepared(hub, "POST", "/keypairs", alice["access_key"], alice["secret_key"], {},
                   sign_body=sign_body)
    assert send("POST", *req).status_code == 201
    # The attacker sends the captured request again, byte for byte, within the window.
    detail = problem(send("POST", *req), 401)
    assert "already received once (a replay)" in detail
    assert len(keypairs_of(hub, alice)) == len(before) + 1  # one keypair, not two


def test_captured_headers_with_another_body_are_refused(hub):
    """The admin's signed PATCH is intercepted and its headers sent with another body."""
    alice = new_user(hub)
    url, headers, _ = prepared(hub, "PATCH", f"/users/{alice['id']}", *hub.admin_keys,
                               {"full_name": "Alice A."}, sign_body=True)
    evil = json.dumps({"role": "superadmin"}).encode()
    detail = problem(send("PATCH", url, headers, evil), 401)
    assert "does not match its signed hash" in detail
    # Dropping the hash header makes it another string to sign: still refused.
    stripped = {k: v for k, v in headers.items() if k != signing.BODY_SHA256_HEADER}
    assert "signature mismatch" in problem(send("PATCH", url, stripped, evil), 401)
    # A forged hash header for the new body is not what was signed either.
    forged = {**headers, signing.BODY_SHA256_HEADER: signing.body_sha256(evil)}
    assert "signature mismatch" in problem(send("PATCH", url, forged, evil), 401)
    assert user_record(hub, alice["id"])["role"] == "user"


def test_headers_of_an_unsigned_body_cannot_be_reused_either(hub):
    """Backend.AI's form (the body is not signed): once the request has been received,
    its headers are spent, whatever body comes with them."""
    alice = new_user(hub)
    url, headers, data = prepared(hub, "PATCH", f"/users/{alice['id']}", *hub.admin_keys,
                                  {"full_name": "Alice A."}, sign_body=False)
    assert send("PATCH", url, headers, data).status_code == 200
    evil = json.dumps({"role": "superadmin"}).encode()
    assert "a replay" in problem(send("PATCH", url, headers, evil), 401)
    assert user_record(hub, alice["id"])["role"] == "user"


# -- row 5: tokens count against the main keypair's rate limit ---------------------------


def login_token(hub, user: dict) -> str:
    s = hub.login(user["email"], "victim-pass-1")
    assert s.cookies.get("jupyterhub-session-id") or s.last_login.ok, s.last_login.text
    return hub.token_for(s, user["username"])


def test_token_requests_count_against_the_main_keypair(hub):
    alice = new_user(hub)
    ak, sk = alice["access_key"], alice["secret_key"]
    r = signed(hub, "PATCH", f"/keypairs/{ak}", *hub.admin_keys, json={"rate_limit": 4})
    assert r.status_code == 200, r.text
    token = login_token(hub, alice)
    auth = {"Authorization": f"token {token}"}
    got = [requests.get(hub.base + API + "/whoami", headers=auth, timeout=60) for _ in range(2)]
    assert [r.status_code for r in got] == [200, 200]
    assert [r.headers["X-RateLimit-Remaining"] for r in got] == ["3", "2"]
    assert {r.headers["X-RateLimit-Limit"] for r in got} == {"4"}
    # A signed request of the main keypair shares the window.
    r = signed(hub, "GET", "/whoami", ak, sk)
    assert r.headers["X-RateLimit-Remaining"] == "1"
    # Minting a keypair with the token counts like any request...
    before = keypairs_of(hub, alice)
    r = requests.post(hub.base + API + "/keypairs", headers=auth, json={}, timeout=60)
    assert r.status_code == 201, r.text
    # ...and past the limit the token is refused, minting included, with nothing made.
    r = requests.post(hub.base + API + "/keypairs", headers=auth, json={}, timeout=60)
    detail = problem(r, 429)
    assert f"user {alice['username']!r} made 4 requests" in detail
    assert f"rate limit of keypair {ak}" in detail
    assert r.headers["X-RateLimit-Remaining"] == "0" and int(r.headers["Retry-After"]) > 0
    assert len(keypairs_of(hub, alice)) == len(before) + 1
    assert requests.get(hub.base + API + "/whoami", headers=auth, timeout=60).status_code == 429


# -- row 6: client addresses -------------------------------------------------------------


SPOOF = {"X-Forwarded-For": "10.9.8.7", "X-Real-Ip": "10.9.8.7"}


def test_forwarding_headers_do_not_bypass_allowed_client_ip(hub):
    alice = new_user(hub)
    token = login_token(hub, alice)
    cookie = hub.login(alice["email"], "victim-pass-1")
    r = signed(hub, "PATCH", f"/users/{alice['id']}", *hub.admin_keys,
               json={"allowed_client_ip": ["10.9.8.7/32"]})
    assert r.status_code == 200, r.text
    ak, sk = alice["access_key"], alice["secret_key"]
    host = urllib.parse.urlsplit(hub.base).netloc

    # Signed, with forwarding headers naming the allowed address: the proxy in front
    # (CHP) appends the real one, and only that entry is believed.
    url = hub.base + API + "/whoami"
    h = signing.sign_request("GET", url, ak, sk)
    r = requests.get(url, headers={**h, "Host": host, **SPOOF}, timeout=60)
    assert "client address 127.0.0.1 is not allowed" in problem(r, 401)
    # A JupyterHub token is checked too (it was not at all).
    r = requests.get(url, headers={"Authorization": f"token {token}", **SPOOF}, timeout=60)
    assert "client address 127.0.0.1 is not allowed" in problem(r, 401)
    r = requests.get(url, headers={"Authorization": f"token {token}"}, timeout=60)
    assert "client address 127.0.0.1 is not allowed" in problem(r, 401)
    # And the login cookie.
    r = cookie.get(url, headers=SPOOF, timeout=60)
    assert "client address 127.0.0.1 is not allowed" in problem(r, 401)
    # Token changes are refused as well: nothing was minted.
    before = keypairs_of(hub, alice)
    r = requests.post(hub.base + API + "/keypairs", json={}, timeout=60,
                      headers={"Authorization": f"token {token}", **SPOOF})
    assert problem(r, 401)
    assert keypairs_of(hub, alice) == before

    # With the real address allowed, every path works, spoofed headers or not.
    r = signed(hub, "PATCH", f"/users/{alice['id']}", *hub.admin_keys,
               json={"allowed_client_ip": ["127.0.0.1/32"]})
    assert r.status_code == 200, r.text
    h = signing.sign_request("GET", url, ak, sk)
    assert requests.get(url, headers={**h, "Host": host, **SPOOF}, timeout=60).status_code == 200
    r = requests.get(url, headers={"Authorization": f"token {token}", **SPOOF}, timeout=60)
    assert r.status_code == 200, r.text
    assert cookie.get(url, headers=SPOOF, timeout=60).status_code == 200


# -- row 14: JSON bounds and plain-words schema errors -------------------------------------


def raw_post(hub, path: str, data: bytes) -> requests.Response:
    url = hub.base + API + path
    h = signing.sign_request("POST", url, *hub.admin_keys)
    return requests.post(url, headers=h, data=data, timeout=60)


def test_deeply_nested_json_is_a_400(hub):
    detail = problem(raw_post(hub, "/domains", b"[" * 100000), 400)
    assert "nested too deeply" in detail and "32 levels" in detail
    deep = b'{"name": "d' + uuid.uuid4().hex[:6].encode() + b'", "x": ' + b"[" * 40 + b"]" * 40 + b"}"
    assert "nested too deeply" in problem(raw_post(hub, "/domains", deep), 400)


def test_oversized_json_is_a_413_in_words(hub):
    """Past 1 MiB the hub does not even keep the body (common/bodylimit.py): read, dropped,
    answered in the admin API's error shape."""
    name = "d" + uuid.uuid4().hex[:8]
    body = json.dumps({"name": name, "description": "x" * (2 << 20)}).encode()
    detail = problem(raw_post(hub, "/domains", body), 413)
    assert "request body too large: at most 1 MiB here" in detail
    r = signed(hub, "GET", f"/domains/{name}", *hub.admin_keys)
    assert r.status_code == 404  # nothing made


def test_schema_errors_are_plain_words_not_regexes(hub):
    r = signed(hub, "POST", "/users", *hub.admin_keys, json={
        "email": "weird@example.com", "username": "Not A Name!", "password": "pass-pass-1",
        "domain_name": "default"})
    detail = problem(r, 400)
    assert detail.startswith("username: must be 1 to 64 lower-case letters")
    for regex_bit in ("^", "$", "[a-z", "{0,63}", "does not match"):
        assert regex_bit not in detail
    r = signed(hub, "POST", "/domains", *hub.admin_keys, json={"name": "bad name"})
    detail = problem(r, 400)
    assert detail.startswith("name: must be 1 to 64 letters, digits")
    assert "^" not in detail and "match" not in detail
    r = signed(hub, "POST", "/domains", *hub.admin_keys, json={"name": 5})
    assert problem(r, 400) == "name: must be a string"
