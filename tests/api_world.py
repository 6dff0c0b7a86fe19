"""Shared pieces of the admin API tests: one hub per module and DB, clients per role, DB snapshots."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest
import requests
from sqlalchemy import select

from jupyterhub_backendai.models import Base, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker

from .conftest import _kill_local_kernels
from .hub import Hub, HubSession

PREFIX = "/hub/api/backendai"
PASSWORD = "pass-word-123"
# Columns the running platform changes on its own (heartbeats, scheduler bookkeeping,
# keypair usage counters): not part of what an API call may or may not change.
VOLATILE = {
    "agents": {"last_heartbeat", "status", "available_slots", "occupied_slots", "version"},
    "resource_groups": {"scheduler_state"},
    "keypairs": {"last_used", "num_queries"},
    "sessions": {"status_info", "status_history"},
}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api_hub(request, tmp_path_factory):
    """A real hub (local backend) shared by one test module, on SQLite or PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('api')}/backendai.sqlite"
    else:
        url = request.getfixturevalue("postgres").new_database("t_" + uuid.uuid4().hex[:12])
    yield from local_hub(url)


def local_hub(url: str):
    """Start a real hub (local backend) on the database at ``url`` with an engine for
    checks, yield it, then stop it and remove what it left (for module fixtures)."""
    hub = Hub(db_url=url, backend="local").start()
    hub.engine = make_engine(url)
    hub.sm = make_sessionmaker(hub.engine)
    yield hub
    hub.close()
    _kill_local_kernels(os.path.join(hub.env["BACKENDAI_STATE_DIR"], "agent", "local-kernels"))
    hub.engine.dispose()
    shutil.rmtree(hub.dir, ignore_errors=True)


class Client:
    """Calls the admin API with one set of credentials."""

    def __init__(self, hub: Hub, token: str | None, name: str = ""):
        self.hub = hub
        self.token = token
        self.name = name
        self.http = HubSession()

    def __call__(self, method: str, path: str, *, json=None, data=None, headers=None,
                 params=None) -> requests.Response:
        h = {"Authorization": f"token {self.token}"} if self.token else {}
        h.update(headers or {})
        return self.http.request(method, self.hub.base + PREFIX + path, json=json, data=data,
                                 headers=h, params=params, timeout=60)

    def ok(self, method: str, path: str, status: int | None = None, **kw):
        r = self(method, path, **kw)
        expected = status or {"POST": 201, "DELETE": 204}.get(method, 200)
        assert r.status_code == expected, (method, path, r.status_code, r.text)
        return r.json() if r.content else None


def superadmin(hub: Hub) -> Client:
    return Client(hub, hub.admin_token, "superadmin")


def new_user(sa: Client, *, role: str = "user", domain: str = "default",
             projects: list[str] | None = None, name: str | None = None) -> dict:
    """A user created through the API, logged in once, with a JupyterHub token."""
    name = name or f"{role}-{uuid.uuid4().hex[:8]}"
    body = {"email": f"{name}@example.com", "password": PASSWORD, "username": name,
            "role": role, "domain_name": domain}
    if projects is not None:
        body["project_ids"] = projects
    u = sa.ok("POST", "/users", json=body)
    s = sa.hub.login(u["email"], PASSWORD)
    assert s.last_login.status_code == 200, s.last_login.text
    u["token"] = sa.hub.token_for(s, name)
    u["client"] = Client(sa.hub, u["token"], name)
    return u


def snapshot(hub: Hub) -> dict:
    """Every row of the record (minus columns the platform changes on its own)."""
    out = {}
    with hub.sm() as s:
        for table in Base.metadata.sorted_tables:
            skip = VOLATILE.get(table.name, set())
            cols = [c for c in table.columns if c.name not in skip]
            rows = s.execute(select(*cols)).all()
            out[table.name] = sorted(repr(tuple(r)) for r in rows)
    return out


def park_session(hub: Hub, user: dict, group: str = "parked", name: str | None = None) -> str:
    """A PENDING session in a resource group without agents: it stays as it is."""
    from jupyterhub_backendai.models import Kernel

    with hub.sm.begin() as s:
        sess = Session(
            name=name or "s-" + uuid.uuid4().hex[:8], session_type="batch",
            user_id=user["id"], access_key=user["keypair"]["access_key"],
            domain_name=user["domain_name"],
            project_id=(user["project_ids"] or [None])[0], resource_group=group,
            image="local/python", startup_command="true", status="PENDING",
        )
        sess.kernels.append(Kernel(status="PENDING"))
        s.add(sess)
        s.flush()
        return sess.id
