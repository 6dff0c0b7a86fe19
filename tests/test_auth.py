"""Login with email or username and password; inactive users are refused with a clear message."""

from __future__ import annotations

import pytest

from jupyterhub_backendai.cli import main as admin_cli


@pytest.fixture
def hub(make_hub, db_url):
    hub = make_hub(db_url=db_url, backend="local")
    assert admin_cli(["--db", db_url, "create-user", "--email", "alice@example.com",
                      "--password", "alice-pass-1"]) == 0
    assert admin_cli(["--db", db_url, "create-user", "--email", "idle@example.com",
                      "--password", "idle-pass-1", "--status", "inactive"]) == 0
    return hub


def test_login_by_email_and_username(hub):
    for login in ("alice@example.com", "alice"):
        s = hub.login(login, "alice-pass-1")
        assert s.last_login.url.endswith("/hub/spawn"), (login, s.last_login.status_code)
    user = hub.api("GET", "/users/alice").json()
    assert user["admin"] is False and "default:default" in user["groups"]
    assert hub.api("GET", "/users/admin").json()["admin"] is True


def test_wrong_password_is_refused(hub):
    s = hub.login("alice@example.com", "wrong-password")
    assert s.last_login.url.endswith("/hub/login")
    assert "Invalid username or password" in s.last_login.text


def test_inactive_user_gets_clear_message(hub):
    s = hub.login("idle@example.com", "idle-pass-1")
    assert s.last_login.status_code == 403
    assert "not active" in s.last_login.text
    assert hub.api("GET", "/users/idle").status_code == 404


def test_user_cannot_spawn_for_another(hub):
    s = hub.login("alice@example.com", "alice-pass-1")
    token = hub.token_for(s, "alice")
    r = hub.spawn("admin", "x", token=token)
    assert r.status_code in (403, 404)
