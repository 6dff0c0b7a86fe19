"""The one session request (common/session_request.py): built by the form, the REST API,
user_options and enqueue's keywords alike; its form checked once when built, with one
error type in plain words; what depends on the record checked once by the manager."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest
from sqlalchemy import func, select

from jupyterhub_backendai.common.errors import InvalidRequest
from jupyterhub_backendai.common.session_request import (
    ClusterMode,
    SessionRequest,
    SessionRequestError,
    SessionType,
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
    with pytest.raises(dataclasses.FrozenInstanceError):
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
            real = mgr.validate

            async def counted(*a, **kw):
                lookups.append(a[0])
                return await real(*a, **kw)

            mgr.validate = counted
            req = SessionRequest(image="local/python", slots=SLOTS, session_type="batch",
                                 startup_command="true")
            await mgr.check_request(req)
            assert lookups == ["local/python"]
            sid = await mgr.enqueue(req, username=user, name="checked", environ={},
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
