"""Cluster-wide settings from etcd (issue 11): the manager's settings tagged
``cluster=True`` are read from ``<prefix>/config/manager/<name>`` in a real etcd
before the manager starts and followed live; a deleted key gives the hub's own value
back; a value the setting refuses, or a key that is no cluster-wide setting, changes
nothing. The effect is checked through what a user meets (a request refused by
``max_slots_per_session``), not only the attribute."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import pytest

from jupyterhub_backendai.common.errors import InvalidRequest
from jupyterhub_backendai.common.session_request import SessionRequest
from jupyterhub_backendai.common.slots import ResourceSlot
from jupyterhub_backendai.models import Domain

from .inproc import running_manager


def _etcdctl(etcd, *args) -> None:
    subprocess.run(["etcdctl", "--endpoints", f"http://127.0.0.1:{etcd.port}", *args],
                   check=True, capture_output=True, timeout=30)


async def _until(cond, timeout: float = 20) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_cluster_settings_come_from_etcd_and_follow_it(etcd_server, tmp_path, caplog):
    prefix = f"/bai-{uuid.uuid4().hex[:8]}"
    key = f"{prefix}/config/manager/"
    # Present before the hub starts: applied before its first defaults are written.
    _etcdctl(etcd_server, "put", key + "default_vfolder_host", json.dumps("nfs9:fast"))
    _etcdctl(etcd_server, "put", key + "max_slots_per_session", "2")

    def cluster_mode(c):
        c.BackendAICluster.etcd_url = f"http://127.0.0.1:{etcd_server.port}"
        c.BackendAICluster.etcd_prefix = prefix
        c.BackendAIManager.agent_lost_timeout = 60.0  # the hub's own value

    big = SessionRequest(image="local/python", slots=ResourceSlot({"cpu": 3, "mem": 2**28}),
                         session_type="batch", startup_command="true")

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/s.sqlite", tmp_path, "local",
                                   configure=cluster_mode) as mgr:
            assert mgr.default_vfolder_host == "nfs9:fast"
            hosts = await mgr.db(lambda s: dict(s.get(Domain, "default").allowed_vfolder_hosts))
            assert "nfs9:fast" in hosts, hosts  # the first defaults used etcd's value
            with pytest.raises(InvalidRequest, match="at most 2 CPU cores"):
                await mgr.check_request(big)

            # Changed live: every hub following the prefix gets it within moments.
            _etcdctl(etcd_server, "put", key + "agent_lost_timeout", "7.5")
            assert await _until(lambda: mgr.agent_lost_timeout == 7.5)

            # Refused by the setting's own validation: logged, the value in force kept.
            _etcdctl(etcd_server, "put", key + "agent_lost_timeout", json.dumps("soon"))
            _etcdctl(etcd_server, "put", key + "max_slots_per_session", "not json")
            # Not a cluster-wide setting: the process's own connection stays its own.
            _etcdctl(etcd_server, "put", key + "db_url", json.dumps("sqlite:///elsewhere"))
            assert await _until(lambda: "db_url ignored" in caplog.text)
            assert await _until(lambda: "max_slots_per_session in etcd is not JSON" in caplog.text)
            assert "agent_lost_timeout='soon' in etcd refused" in caplog.text
            assert mgr.agent_lost_timeout == 7.5
            assert mgr.max_slots_per_session == 2
            assert mgr.db_url.endswith("s.sqlite")

            # Deleted: the hub's configuration again, and the request passes.
            _etcdctl(etcd_server, "del", key + "max_slots_per_session")
            _etcdctl(etcd_server, "del", key + "agent_lost_timeout")
            assert await _until(lambda: mgr.max_slots_per_session == 0
                                and mgr.agent_lost_timeout == 60.0)
            await mgr.check_request(big)

    caplog.set_level("INFO")
    try:
        asyncio.run(run())
    finally:
        _etcdctl(etcd_server, "del", "--prefix", prefix + "/")


def test_max_slots_per_session_from_the_config_counts_every_kernel(tmp_path):
    """Without etcd (the embedded default) the hub's config holds; a multi-kernel
    session counts the cores of all its kernels."""
    def limit(c):
        c.BackendAIManager.max_slots_per_session = 2

    async def run():
        async with running_manager(f"sqlite:///{tmp_path}/m.sqlite", tmp_path, "local",
                                   configure=limit) as mgr:
            one = ResourceSlot({"cpu": 1, "mem": 2**28})
            await mgr.validate("local/python", one, "default", cluster_size=2)
            with pytest.raises(InvalidRequest, match="at most 2 CPU cores here .*; 3 requested"):
                await mgr.validate("local/python", one, "default", cluster_size=3)

    asyncio.run(run())
