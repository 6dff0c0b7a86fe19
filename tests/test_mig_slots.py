"""MIG instances as slots of their own (``cuda.mig-<profile>``), end to end through the
manager: request, scheduling, the agent's allocation by profile, the kernel's
environment, release.

There is no GPU on CI: the agent's GPUs come from an NVML STAND-IN
(``nvml_standin.stand_in("a100-mig")``: two A100-80GB, GPU 0 in MIG mode with one
3g.40gb, one 2g.20gb and two 1g.10gb instances, GPU 1 whole), read by the real
discovery code (``NVMLDeviceSource``). Everything else is real: the manager, its
database, the scheduler, the agent and its kernel processes (local backend).
"""

from __future__ import annotations

import asyncio

import pytest
from jsonschema.exceptions import best_match
from sqlalchemy import func, select
from traitlets.config import Config

from jupyterhub_backendai.agent.core import Agent as LocalAgent
from jupyterhub_backendai.agent.resources.cuda import NVMLDeviceSource
from jupyterhub_backendai.agent.resources.nvml_standin import stand_in
from jupyterhub_backendai.api.base import _Validator, schema_error_words
from jupyterhub_backendai.api.document import build_document
from jupyterhub_backendai.common.errors import InvalidRequest
from jupyterhub_backendai.common.session_request import (
    SessionRequest,
    SessionRequestError,
    resources,
)
from jupyterhub_backendai.manager.crud import parse_slots
from jupyterhub_backendai.models import Session

from .inproc import (
    DEAD,
    agent_config,
    assert_consistent,
    gpu_batch,
    make_user,
    occupied,
    running_manager,
    wait_status,
)

MIG = "cuda.mig-1g.10gb"


async def _mig_agent(mgr, tmp_path) -> LocalAgent:
    """A second in-process agent whose GPUs are the stand-in's a100-mig machine."""
    c = Config()
    c.merge(mgr.test_config)
    agent_config(c, tmp_path, "local", slots={"cpu": 8, "mem": "8g"}, name="mig")
    agent = LocalAgent(mgr.bus, config=c)
    agent.device_source = NVMLDeviceSource(stand_in("a100-mig"))  # the stand-in, not a GPU
    await mgr.attach_agent(agent)
    return agent


async def _visible(mgr, sid) -> str:
    """The kernel's CUDA_VISIBLE_DEVICES, from its own output (NVIDIA_VISIBLE_DEVICES
    the same)."""
    for _ in range(400):
        for line in (await mgr.session_logs(sid) or "").splitlines():
            if line.startswith("VISIBLE="):
                visible, nv = line.removeprefix("VISIBLE=").split(" NV=")
                assert nv == visible
                return visible
        await asyncio.sleep(0.05)
    raise AssertionError(f"session {sid} printed no environment")


def test_mig_slots_through_the_manager(tmp_path):
    async def run():
        db_url = f"sqlite:///{tmp_path}/backendai.sqlite"
        # The embedded agent has no GPU (cpu/mem only); MIG and whole GPUs are on "mig".
        async with running_manager(db_url, tmp_path, "local", slots={"cpu": 2, "mem": "4g"}) as mgr:
            agent = await _mig_agent(mgr, tmp_path)
            gpu0, gpu1 = agent.devices
            assert gpu0.mig_enabled and not gpu1.mig_enabled
            small = [m for m in gpu0.mig_instances if m.profile == "1g.10gb"]
            assert len(small) == 2
            # The agent offers the MIG-mode GPU only as its instances, never as a device.
            assert {k: int(v) for k, v in agent.capacity.items() if k.startswith("cuda.")} == {
                "cuda.device": 1, "cuda.mig-3g.40gb": 1, "cuda.mig-2g.20gb": 1, MIG: 2}
            user = await make_user(mgr)

            first = await gpu_batch(mgr, user, "mig-a", {MIG: 1})
            await wait_status(mgr, first, ("RUNNING",))
            second = await gpu_batch(mgr, user, "mig-b", {MIG: "1"})
            await wait_status(mgr, second, ("RUNNING",))
            got = {await _visible(mgr, first), await _visible(mgr, second)}
            assert got == {m.uuid for m in small}  # each its own instance of that profile
            for sid in (first, second):
                sess = await mgr.get_session(sid)
                assert sess.kernels[0].agent_id == agent.agent_id

            # Both 1g.10gb instances are taken: the third waits and says for what.
            third = await gpu_batch(mgr, user, "mig-c", {MIG: 1})
            await wait_status(mgr, third, ("PENDING",))
            for _ in range(100):
                pending = await mgr.get_session(third)
                if pending.status_info and MIG in pending.status_info:
                    break
                await asyncio.sleep(0.05)
            assert pending.status == "PENDING"
            assert "waiting for resources" in pending.status_info and MIG in pending.status_info

            # A whole-device request gets GPU 1, never the MIG-mode GPU 0 ...
            whole = await gpu_batch(mgr, user, "whole", {"cuda.device": 1})
            await wait_status(mgr, whole, ("RUNNING",))
            assert await _visible(mgr, whole) == gpu1.uuid
            # ... and two whole devices are more than any agent has: a 400, nothing made.
            before = await mgr.db(lambda s: s.scalar(select(func.count()).select_from(Session)))
            with pytest.raises(InvalidRequest, match="GPU"):
                await gpu_batch(mgr, user, "two", {"cuda.device": 2})
            # A bad profile: a 400 in plain words, nothing made.
            with pytest.raises(SessionRequestError) as e:
                await gpu_batch(mgr, user, "bad", {"cuda.mig-1g.10": 1})
            assert str(e.value.detail) == (
                "slots: 'cuda.mig-1g.10' is not a MIG slot: the profile after 'cuda.mig-' must "
                "be an NVML MIG profile such as 1g.10gb, 3g.40gb or 1g.10gb+me")
            assert e.value.status_code == 400
            # A profile no agent has: refused at once (not queued forever).
            with pytest.raises(InvalidRequest, match="cuda.mig-7g.80gb"):
                await gpu_batch(mgr, user, "big", {"cuda.mig-7g.80gb": 1})
            after = await mgr.db(lambda s: s.scalar(select(func.count()).select_from(Session)))
            assert after == before

            # One ends: the third is placed on the instance it freed.
            freed = await _visible(mgr, first)
            await mgr.destroy_session(first)
            await wait_status(mgr, first, DEAD)
            await wait_status(mgr, third, ("RUNNING",))
            assert await _visible(mgr, third) == freed

            for sid in (second, third, whole):
                await mgr.destroy_session(sid)
                await wait_status(mgr, sid, DEAD)
            # Every slot back: the agent's record and its own books.
            assert (await occupied(mgr))[agent.agent_id] == {}
            assert agent.gpus.owners() == {}
            assert_consistent(mgr)

    asyncio.run(run())


def test_mig_slot_names_in_plain_words():
    """The one definition of slot names, in every place that reads them."""
    # user_options / the API's resources: cuda.mig-<profile> is a count.
    image, slots = resources({"image": "x", "cpu": 1, "mem": "1g", MIG: "2"})
    assert slots[MIG] == 2
    for value, words in ((0.5, "0.5"), (-1, "-1"), ("two", "'two'")):
        with pytest.raises(SessionRequestError) as e:
            resources({"image": "x", MIG: value})
        assert str(e.value.detail) == (
            f"{MIG} must be a whole number of MIG instances (0 or more), not {words}")
    with pytest.raises(SessionRequestError, match=r"^'cuda\.mig-big' is not a MIG slot"):
        resources({"image": "x", "cuda.mig-big": 1})
    req = SessionRequest.from_options({"image": "x", "cuda.mig-1g.5gb+me": 1})
    assert dict(req.slots)["cuda.mig-1g.5gb+me"] == 1
    with pytest.raises(SessionRequestError, match="^unknown option"):
        SessionRequest.from_options({"image": "x", "cuda.mig": 1})
    with pytest.raises(SessionRequestError) as e:
        SessionRequest(image="x", slots={"cpu": 1, "gpus": 1})
    assert str(e.value.detail) == (
        "slots: unknown slot 'gpus' (slots are cpu, mem, cuda.device or cuda.mig-<profile> "
        "(an NVML MIG profile such as 1g.10gb, 3g.40gb or 1g.10gb+me))")

    # Admin policies (total_resource_slots): MIG slots too, whole.
    assert parse_slots("total_resource_slots", {MIG: "3"})[MIG] == 3
    with pytest.raises(InvalidRequest, match="whole number of MIG instances"):
        parse_slots("total_resource_slots", {MIG: "1.5"})
    with pytest.raises(InvalidRequest, match=r"^total_resource_slots: 'cuda\.mig-x' is not a MIG"):
        parse_slots("total_resource_slots", {"cuda.mig-x": 1})

    # The API document: the same names, and its 400s say the pattern in words.
    schemas = build_document()["components"]["schemas"]

    def words(schema: str, body: dict) -> str | None:
        err = best_match(_Validator(schemas[schema]).iter_errors(body))
        return None if err is None else schema_error_words(err)

    create = {"name": "s", "image": "x", "startup_command": "true"}
    assert words("SessionCreate", {**create, "resources": {"cpu": 1, MIG: 1}}) is None
    assert words("SessionCreate", {**create, "resources": {"cuda.mig-1g": 1}}) == (
        "resources are cpu, mem, gpu or cuda.mig-<profile> (an NVML MIG profile such as "
        "1g.10gb, 3g.40gb or 1g.10gb+me)")
    policy = "KeypairResourcePolicyCreate"
    assert words(policy, {"name": "p", "total_resource_slots": {MIG: "1"}}) is None
    assert words(policy, {"name": "p", "total_resource_slots": {"gpu": "1"}}) == (
        "slot names must be cpu, mem, cuda.device or cuda.mig-<profile> (an NVML MIG profile "
        "such as 1g.10gb, 3g.40gb or 1g.10gb+me)")


def test_backendai_client_resources_name_mig_slots():
    """`backend.ai session create -r cuda.mig-1g.10gb=1` sends Backend.AI's resources;
    the compat layer passes MIG slots on to the one request parser, and still refuses
    what is not offered."""
    from jupyterhub_backendai.api.compat.sessions import BackendAISessionCreate, _resources

    req = BackendAISessionCreate.parse(
        {"name": "m", "image": "x", "config": {"resources": {"cpu": 1, "mem": "1g", MIG: 1}}})
    assert (req.image, req.slots[MIG]) == ("x", 1)
    with pytest.raises(InvalidRequest, match="'tpu.device' is not offered here"):
        _resources({"resources": {"tpu.device": 1}})
    with pytest.raises(SessionRequestError, match=r"'cuda\.mig-big' is not a MIG slot"):
        BackendAISessionCreate.parse(
            {"name": "m", "image": "x", "config": {"resources": {"cuda.mig-big": 1}}})
