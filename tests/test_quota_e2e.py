"""End to end through the hub with real containers: a project quota holds a third
session PENDING with its reason, and lets it start once another session ends.
The scheduler's state shows on the hub's /hub/metrics.
"""

from __future__ import annotations

import json

import requests
from sqlalchemy import select

from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.common.types import SessionStatus
from jupyterhub_backendai.manager.scheduler import check_consistency
from jupyterhub_backendai.models import Agent, Project, Session
from jupyterhub_backendai.models.db import make_engine, make_sessionmaker
from jupyterhub_backendai.spawner import _passed_states

from .conftest import containers_of


def _progress_until(hub, server: str, needle: str, limit: int = 10) -> list[str]:
    """Messages of the server's progress stream, up to the first containing ``needle``."""
    url = hub.base + f"/hub/api/users/admin/servers/{server}/progress"
    msgs: list[str] = []
    with requests.get(url, headers={"Authorization": f"token {hub.admin_token}"},
                      stream=True, timeout=30) as r:
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                msgs.append(json.loads(line[5:])["message"])
                if needle in msgs[-1] or len(msgs) >= limit:
                    break
    return msgs


def _session(sm, name: str) -> Session:
    with sm() as s:
        return s.scalar(select(Session).where(Session.name == name).order_by(Session.created_at.desc()))


def _metrics(hub) -> str:
    # JupyterHub authenticates /hub/metrics (authenticate_prometheus): the admin token may read it.
    r = requests.get(hub.base + "/hub/metrics", headers={"Authorization": f"token {hub.admin_token}"},
                     timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def test_project_quota_holds_third_session_until_one_ends(make_hub, db_url, docker_image):
    hub = make_hub(db_url=db_url, backend="docker", slots={"cpu": 4, "mem": "8g"})
    engine = make_engine(hub.db_url)
    sm = make_sessionmaker(engine)
    try:
        with sm.begin() as s:
            project = s.scalar(select(Project).where(Project.name == "default"))
            project.total_resource_slots = ResourceSlot(cpu=1)

        for name in ("one", "two"):
            assert hub.spawn("admin", name).status_code in (201, 202)
        hub.wait_ready("admin", "one")
        hub.wait_ready("admin", "two")

        # The agent has room (4 cores) but the project's quota (1 core) is used up.
        r = hub.spawn("admin", "three")
        assert r.status_code == 202, r.text
        msgs = _progress_until(hub, "three", "quota exceeded")
        reason = ("quota exceeded: your project allows 1 core in total; 1 core is in use and this "
                  "session asks for 0.5 more (project 'default', total_resource_slots)")
        assert "pending: " + reason in msgs, msgs
        third = _session(sm, "three")
        assert third.status == "PENDING"
        assert third.status_info == reason
        model = hub.server_model("admin", "three")
        assert model["pending"] == "spawn" and not model["ready"]
        assert len(containers_of(hub.agent_id)) == 2

        metrics = _metrics(hub)
        assert 'backendai_scheduler_queue_length{resource_group="default"} 1.0' in metrics, metrics[-3000:]
        assert 'backendai_scheduler_rejections_total{reason="quota_project",resource_group="default"}' in metrics
        assert 'backendai_scheduler_placements_total{resource_group="default"} 2.0' in metrics

        hub.stop_server("admin", "one")
        hub.wait_ready("admin", "three", timeout=120)
        third = _session(sm, "three")
        assert third.status == "RUNNING"
        assert "PENDING" in third.status_history and "SCHEDULED" in third.status_history
        assert len(containers_of(hub.agent_id)) == 2
        with sm() as s:
            assert s.get(Agent, hub.agent_id).occupied_slots.nonzero() == {"cpu": 1, "mem": 2**30}
        assert check_consistency(sm) == []
        metrics = _metrics(hub)
        assert 'backendai_scheduler_queue_length{resource_group="default"} 0.0' in metrics
        assert 'backendai_scheduler_placements_total{resource_group="default"} 3.0' in metrics

        for name in ("two", "three"):
            hub.stop_server("admin", name)
        assert containers_of(hub.agent_id) == []
        assert check_consistency(sm) == []
        with sm() as s:
            assert s.get(Agent, hub.agent_id).occupied_slots.nonzero() == {}
            results = {x.name: x.result for x in s.scalars(select(Session))}
        assert results == {"one": "SUCCESS", "two": "SUCCESS", "three": "SUCCESS"}
    finally:
        engine.dispose()


def test_progress_replays_the_states_already_passed():
    """A progress page that connects while the session is CREATING first sees pending,
    scheduled and preparing; after a failed start (back to PENDING) nothing is replayed."""
    history = {st: "2026-01-01T00:00:00+00:00" for st in ("PENDING", "SCHEDULED", "PREPARING", "CREATING")}
    assert [s.value for s in _passed_states(SessionStatus.CREATING, history)] == [
        "PENDING", "SCHEDULED", "PREPARING"]
    assert _passed_states(SessionStatus.PENDING, history) == []
    assert [s.value for s in _passed_states(SessionStatus.RUNNING, {"PENDING": "x", "SCHEDULED": "x"})] == [
        "PENDING", "SCHEDULED"]


def test_project_choice_decides_which_quota_applies(make_hub, tmp_path):
    """A user in two projects picks one (form or API); each project's quota counts its own sessions."""
    hub = make_hub(db_url=f"sqlite:///{tmp_path}/choice.sqlite", backend="local")
    engine = make_engine(hub.db_url)
    sm = make_sessionmaker(engine)
    try:
        from jupyterhub_backendai.manager import tenancy
        from jupyterhub_backendai.models import User

        with sm.begin() as s:
            research = tenancy.create_project(s, "default", "research")
            admin = s.scalar(select(User).where(User.username == "admin"))
            admin.projects.append(research)
            default = s.scalar(select(Project).where(Project.name == "default"))
            default.total_resource_slots = ResourceSlot(cpu="0.5")

        page = hub.login().get(hub.base + "/hub/spawn/admin/any")
        assert 'name="project"' in page.text and '<option value="research"' in page.text

        r = hub.spawn("admin", "bad", {"project": "elsewhere"})
        assert r.status_code == 400 and "project 'elsewhere' is not one of yours" in r.text, r.text
        assert _session(sm, "bad") is None

        assert hub.spawn("admin", "one").status_code in (201, 202)
        hub.wait_ready("admin", "one")
        assert hub.spawn("admin", "two", {"project": "research"}).status_code in (201, 202)
        hub.wait_ready("admin", "two")
        assert hub.spawn("admin", "three").status_code == 202
        msgs = _progress_until(hub, "three", "quota exceeded")
        assert "pending: quota exceeded: your project allows 0.5 cores in total; 0.5 cores are in " \
               "use and this session asks for 0.5 more (project 'default', total_resource_slots)" \
               in msgs, msgs
        with sm() as s:
            names = {p.id: p.name for p in s.scalars(select(Project))}
        assert names[_session(sm, "two").project_id] == "research"
        assert names[_session(sm, "one").project_id] == "default"
        for name in ("one", "two", "three"):
            hub.stop_server("admin", name)
        assert check_consistency(sm) == []
    finally:
        engine.dispose()
