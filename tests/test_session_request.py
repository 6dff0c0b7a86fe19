"""The one session request (common/session_request.py): built by the form, the REST API,
user_options and enqueue's keywords alike; its form checked once when built, with one
error type in plain words; what depends on the record checked once by the manager."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from jupyterhub_backendai.common.errors import InvalidRequest
from jupyterhub_backendai.common.session_request import (
    ClusterMode,
    SessionRequest,
    SessionRequestError,
    SessionType,
    check_environ,
    whole_number,
)
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Session

from .inproc import make_user, running_manager

SLOTS = ResourceSlot(cpu="0.5", mem=512 * 2**20)


def test_form_options_become_one_typed_request():
    r = SessionRequest.from_options(
        {"image": " img ", "cpu": "1.5", "mem": "1.5 GiB", "gpu": "1", "cluster_size": "2",
         "cluster_mode": "multi-node", "project": "p", "mounts": ["data", " ", "more "]},
        resource_group="gpus")
    assert r.image == "img"
    assert r.slots == ResourceSlot({"cpu": "1.5", "mem": 3 * 2**29, "cuda.device": "1"})
    assert (r.cluster_size, r.cluster_mode, r.session_type) == (
        2, ClusterMode.MULTI_NODE, SessionType.INTERACTIVE)
    assert isinstance(r.cluster_mode, ClusterMode) and isinstance(r.session_type, SessionType)
    assert (r.resource_group, r.project, r.mounts) == ("gpus", "p", ("data", "more"))
    # The defaults a request leaves out.
    d = SessionRequest.from_options({"image": "img"})
    assert d.slots == ResourceSlot({"cpu": "1", "mem": 2**30})
    assert (d.cluster_size, d.cluster_mode, d.mounts, d.project) == (
        1, ClusterMode.SINGLE_NODE, (), None)
    with pytest.raises(ValidationError, match="frozen"):
        d.image = "other"  # checked once: it cannot change afterwards


@pytest.mark.parametrize("options, message", [
    ({}, "image is required"),
    ({"image": "i", "cpu": "lots"}, "cpu must be a number, not 'lots'"),
    ({"image": "i", "mem": "lots"}, "mem must be a size like 512m, 2g or 1.5 GiB, not 'lots'"),
    ({"image": "i", "gpu": "0.5"}, "gpu must be a whole number >= 0, not 0.5"),
    ({"image": "i", "cluster_size": "two"}, "cluster_size must be a whole number >= 1, not 'two'"),
    ({"image": "i", "cluster_size": True}, "cluster_size must be a whole number >= 1, not True"),
    ({"image": "i", "cluster_size": "0"}, "cluster_size must be a whole number >= 1, not 0"),
    ({"image": "i", "cluster_mode": "ring"},
     "cluster_mode must be one of single-node, multi-node, not 'ring'"),
    ({"image": "i", "mounts": "data"}, "mounts must be a list of vfolder names or ids"),
    ({"image": "i", "shell": "bash"}, "unknown option(s): shell"),
])
def test_bad_options_one_error_in_plain_words(options, message):
    with pytest.raises(SessionRequestError) as e:
        SessionRequest.from_options(options)
    assert e.value.detail == message
    assert e.value.status_code == 400 and isinstance(e.value, InvalidRequest)


@pytest.mark.parametrize("kw, message", [
    ({"priority": True}, "priority must be a whole number from 0 to 100, not True"),
    ({"priority": 101}, "priority must be a whole number from 0 to 100, not 101"),
    ({"session_type": "cron"}, "session_type must be one of interactive, batch, not 'cron'"),
    ({"session_type": "batch", "startup_command": "true", "batch_timeout": False},
     "batch_timeout must be a whole number of seconds > 0, not False"),
    ({"starts_at": "2030-01-01T09:00:00"}, "starts_at needs a time zone (e.g. 2030-01-01T09:00:00+00:00)"),
    ({"dependencies": ["a", "a"]}, "dependencies lists a session twice"),
    ({"slots": {"cpu": 1, "disk": 5}}, "slots: unknown slot 'disk' (slots are cpu, mem, cuda.device "
     "or cuda.mig-<profile> (an NVML MIG profile such as 1g.10gb, 3g.40gb or 1g.10gb+me))"),
])
def test_bad_fields_one_error_in_plain_words(kw, message):
    with pytest.raises(SessionRequestError) as e:
        SessionRequest(**{"image": "i", "slots": SLOTS, **kw})
    assert e.value.detail == message


def test_whole_number_is_the_one_check():
    assert whole_number("n", 3) == 3
    assert whole_number("n", " 4 ", text=True) == 4
    for bad in (True, False, 2.0, "4", None):
        with pytest.raises(SessionRequestError, match="n must be a whole number"):
            whole_number("n", bad)
    starts = SessionRequest(image="i", slots=SLOTS, session_type="batch", startup_command="true",
                            starts_at="2030-01-01T09:00:00+00:00")
    assert starts.starts_at == dt.datetime(2030, 1, 1, 9, tzinfo=dt.UTC)


def test_enqueue_takes_a_request_or_its_keywords_and_checks_it_once(tmp_path):
    """The manager checks what depends on the record once per request: a request that
    passed check_request is not looked up again by enqueue; one given as keywords is
    checked there; a bad one is refused with nothing left."""
    db_url = f"sqlite:///{tmp_path}/req.sqlite"

    async def run():
        async with running_manager(db_url, tmp_path, "local") as mgr:
            user = await make_user(mgr)
            lookups = []
            real = mgr.sessions.validate

            async def counted(*a, **kw):
                lookups.append(a[0])
                return await real(*a, **kw)

            mgr.sessions.validate = counted
            req = SessionRequest(image="local/python", slots=SLOTS, session_type="batch",
                                 startup_command="true")
            checked = await mgr.check_request(req)
            assert lookups == ["local/python"]
            assert await mgr.check_request(checked) is checked
            sid = await mgr.enqueue(checked, username=user, name="checked", environ={},
                                    service_prefix="/")
            assert lookups == ["local/python"]  # not looked up again
            # The keywords of the callers before the request existed build one, checked here.
            sid2 = await mgr.enqueue(username=user, name="keywords", image="local/python",
                                     slots=SLOTS, environ={}, service_prefix="/",
                                     session_type="batch", startup_command="true",
                                     cluster_mode="single-node", dependencies=[sid])
            assert lookups == ["local/python", "local/python"]
            with pytest.raises(TypeError, match="a request and its fields"):
                await mgr.enqueue(req, username=user, name="both", environ={},
                                  service_prefix="/", image="x")

            def rows(s):
                return {r.id: (r.session_type, r.cluster_mode, [d.id for d in r.dependencies])
                        for r in s.scalars(select(Session))}

            got = await mgr.db(rows)
            assert got == {sid: ("batch", "single-node", []), sid2: ("batch", "single-node", [sid])}
            with pytest.raises(SessionRequestError, match="cluster_mode must be one of"):
                await mgr.enqueue(username=user, name="bad", image="local/python", slots=SLOTS,
                                  environ={}, service_prefix="/", cluster_mode="ring")
            assert await mgr.db(lambda s: s.scalar(select(func.count()).select_from(Session))) == 2

    asyncio.run(run())


# -- one model on every edge: the admin API's body and Backend.AI's, parsed once ----------


def _rest(body):
    from jupyterhub_backendai.api import models
    return models.parse("SessionCreate", body)


def _bai(body):
    from jupyterhub_backendai.api.compat.sessions import BackendAISessionCreate
    return BackendAISessionCreate.parse(body)


def test_rest_and_backendai_forms_of_one_request_are_equal():
    rest = _rest({"name": "train", "image": " img ", "startup_command": "python t.py",
                  "type": "batch", "resources": {"cpu": "0.5", "mem": "128m", "gpu": 1},
                  "resource_group": "gpus", "project": "p", "cluster_size": 2,
                  "cluster_mode": "multi-node", "starts_at": "2100-01-01T00:00:00+00:00",
                  "dependencies": ["a"], "mounts": ["data", " "]})
    for name_key, type_key, size_key in (("name", "type", "clusterSize"),
                                         ("sessionName", "sessionType", "cluster_size"),
                                         ("clientSessionToken", "type", "clusterSize")):
        bai = _bai({name_key: "train", "image": " img ", "startupCommand": "python t.py",
                    type_key: "batch", "group": "p", size_key: 2, "clusterMode": "multi-node",
                    "starts_at": "2100-01-01T00:00:00+00:00", "dependencies": ["a"],
                    "enqueueOnly": True, "tag": "ignored", "architecture": "aarch64",
                    "config": {"resources": {"cpu": "0.5", "mem": "128m", "cuda.device": 1},
                               "scalingGroup": "gpus", "mounts": ["data", " "]}})
        assert bai.name == rest.name == "train"
        assert bai.as_request() == rest.as_request()
        assert isinstance(rest, SessionRequest) and isinstance(bai, SessionRequest)
    r = rest.as_request()
    assert (r.image, r.session_type, r.cluster_mode, r.mounts, r.architecture) == (
        "img", SessionType.BATCH, ClusterMode.MULTI_NODE, ("data",), None)
    assert r.slots == ResourceSlot({"cpu": "0.5", "mem": 128 * 2**20, "cuda.device": 1})
    assert str(r.slots["cuda.device"]) == "1"  # a whole number read as sent, not 1.0
    # The form's request is the same model too.
    form = SessionRequest.from_options({"image": "img", "cpu": "0.5", "mem": "128m", "gpu": "1",
                                        "cluster_size": "2", "cluster_mode": "multi-node",
                                        "project": "p", "mounts": ["data"]},
                                       resource_group="gpus")
    assert form.slots == r.slots and form.mounts == r.mounts


def test_rest_body_in_the_apis_words_and_the_rules_words():
    body = {"name": "s", "image": "i", "startup_command": "true"}
    rest = _rest({**body, "starts_at": "2030-01-01T09:00:00"})
    assert rest.starts_at == dt.datetime(2030, 1, 1, 9, tzinfo=dt.UTC)  # no zone: UTC
    assert rest.session_type == SessionType.BATCH and rest.resource_group == "default"
    for change, words in (
            ({"designated_agents": ["a"]}, "unknown field(s): 'designated_agents' (allowed: "
             "name, image, resources, resource_group, type, project, cluster_size, "
             "cluster_mode, priority, startup_command, batch_timeout, starts_at, "
             "dependencies, mounts)"),
            ({"image": " "}, "image is required"),
            ({"project": ""}, "project must be a project's name or id"),
            ({"resources": {"cpu": "-1"}}, "cpu must be positive, not -1"),
            ({"starts_at": "tomorrow"}, "starts_at: 'tomorrow' is not an ISO 8601 date-time"),
            ({"dependencies": ["a", "a"]}, "dependencies lists a session twice"),
            ({"cluster_size": "2"}, "cluster_size: must be a whole number"),
            ({"name": "bad name", "image": ""},
             "name: must be 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter "
             "or digit")):
        with pytest.raises(InvalidRequest) as e:
            _rest({**body, **change})
        assert e.value.detail == words


def test_backendai_body_refusals_name_the_clients_field():
    body = {"name": "ok", "image": "i", "type": "batch", "startupCommand": "true"}
    for change, words in (
            ({"clusterSize": "3"}, "clusterSize must be a whole number from 0 to 16, not '3'"),
            ({"type": "inference"}, "type must be batch or interactive, not 'inference' "
             "(inference sessions are not offered here)"),
            ({"config": {"mount_map": {"a": "/x"}}},
             "config.mount_map is not supported by this server"),
            ({"config": []}, "config: wrong type"),
            ({"config": {"scalingGroup": 5}}, "config.scalingGroup: wrong type"),
            ({"name": None}, "name: required field missing"),
            ({"starts_at": "2030-01-01T09:00:00"},
             "starts_at needs a time zone (e.g. 2030-01-01T09:00:00+00:00)"),
            ({"clusterMode": "ring"},
             "cluster_mode must be one of single-node, multi-node, not 'ring'"),
            ({"startupCommand": None}, "a batch session needs a startup_command")):
        with pytest.raises(SessionRequestError) as e:
            _bai({**body, **change})
        assert e.value.detail == words
    # a session's own environment variables (Backend.AI's config.environ): checked apart
    assert check_environ({"A_1": "x y", "b": ""}) == {"A_1": "x y", "b": ""}
    assert check_environ(None) == {}
    for env, words in (
            ([], "environ must be an object of NAME: value"),
            ({"1A": "x"}, "environ: '1A' is not a variable name"),
            ({"A-B": "x"}, "environ: 'A-B' is not a variable name"),
            ({"jupyterhub_api_token": "x"}, "environ: 'jupyterhub_api_token' is the platform's"),
            ({"BACKENDAI_X": "x"}, "environ: 'BACKENDAI_X' is the platform's own"),
            ({"A": 1}, "environ: the value of 'A' must be text"),
            ({"A": "a\0b"}, "environ: the value of 'A' must be text"),
            ({f"V{i}": "" for i in range(65)}, "environ: at most 64 variables")):
        with pytest.raises(SessionRequestError) as e:
            check_environ(env)
        assert e.value.detail.startswith(words), e.value.detail
    # An interactive session runs no command; zero or null mean the defaults.
    r = _bai({"name": "i", "image": "i", "startupCommand": "x", "clusterSize": 0, "group": "",
              "config": {"scalingGroup": None}})
    assert (r.session_type, r.startup_command, r.cluster_size, r.project, r.resource_group,
            r.reuse_if_exists, r.enqueue_only, r.max_wait_seconds) == (
        SessionType.INTERACTIVE, None, 1, None, "default", True, False, 0)


def test_request_errors_from_keywords():
    with pytest.raises(TypeError, match="shell"):
        SessionRequest(image="i", slots=SLOTS, shell="bash")
    with pytest.raises(SessionRequestError, match="^image is required$"):
        SessionRequest(slots=SLOTS)
    with pytest.raises(SessionRequestError, match="^starts_at must be a time, not 5$"):
        SessionRequest(image="i", slots=SLOTS, starts_at=5)
    with pytest.raises(SessionRequestError, match="^cluster_size must be at most 16, not 17$"):
        SessionRequest(image="i", slots=SLOTS, cluster_size=17)
