"""The hub's view of the cluster: node TLS, and agents and storage proxies from etcd.

:class:`BackendAICluster` (configured as ``c.BackendAICluster.*``) holds

- ``tls``: the hub's certificate for mutual TLS with agent and storage proxy
  daemons (``common/httpbase.py``, ``common/certs.py``);
- ``etcd_url``: in cluster mode, where agents register (``common/etcdreg.py`` has
  the key layout). The hub reads the prefix, then watches it: an agent key that
  appears is a join once the agent answers a direct call as that agent (it is then
  upserted through the manager's own ``upsert_agent``, as a heartbeat does; one that
  does not answer yet is asked again, at most ``REVOUCH_MAX`` seconds apart, while
  its registration stands, and joins once it answers), one that disappears (the agent stopped,
  or its lease expired after it died) is a leave: the agent is marked
  ``AgentStatus.LOST``. Storage proxies under ``config/storage-proxies/`` are
  added to the manager's storage registry. The manager's cluster-wide settings
  (its traits tagged ``cluster=True``) are read from ``config/manager/<name>``
  before the manager starts and followed live: a value there overrides the hub's
  own configuration until the key is deleted (then the configured value is back);
  a value the setting refuses (its trait's validation) is logged and not applied.
  Container registries under ``config/container-registries/`` are mirrored into the
  record (manager/registries.py), and the admin API writes them here.
  Without ``etcd_url`` (the embedded default) agents come from heartbeats, storage
  proxies from ``c.BackendAIManager.storage_proxies`` and settings from the config.

Other parts of the hub follow joins and leaves with :meth:`BackendAICluster.subscribe`
(a callback ``async (kind, agent_id, info)`` with kind ``"join"`` or ``"leave"``) or
:meth:`BackendAICluster.changes` (an async iterator of the same tuples).
A lost connection to etcd (etcd restarted) is retried; on reconnect the hub reads
the prefix again and compares it with what it knew, so no join or leave is missed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from traitlets import Dict, Float, TraitError, Unicode, default
from traitlets.config import LoggingConfigurable

from ..common.errors import InvalidRequest, ServiceUnavailable
from ..common.etcdreg import AGENTS, REGISTRIES, SETTINGS, STORAGE_PROXIES, etcd_client
from ..common.httpbase import TLSFiles
from ..common.tasks import stop_task, wait_set
from ..common.types import AgentStatus
from . import registries
from .reconcile import upsert_agent

Listener = Callable[[str, str, dict], Awaitable[None]]


class BackendAICluster(LoggingConfigurable):
    tls = Dict(
        help="""The hub's certificate for calls to agent and storage proxy daemons:
        {"cert": ".../hub/hub.crt", "key": ".../hub/hub.key", "ca":
        ".../cluster-ca/cluster-ca.crt"} (made by `python -m
        jupyterhub_backendai.common.certs DIR`). Used for every https:// agent
        address and storage proxy URL. Empty: only the deprecated shared tokens.""",
    ).tag(config=True)
    etcd_url = Unicode(
        help="""etcd endpoint (http://host:port) of the cluster (env
        BACKENDAI_ETCD_URL). Set: agents are learnt from their registrations and
        storage proxies from the cluster's configuration there. Empty (embedded
        default): from heartbeats and c.BackendAIManager.storage_proxies.""",
    ).tag(config=True)

    @default("etcd_url")
    def _etcd_url_default(self):
        import os

        return os.environ.get("BACKENDAI_ETCD_URL", "")

    etcd_prefix = Unicode("/backendai", help="Key prefix of this cluster in etcd.").tag(config=True)
    rejoin_grace = Float(
        20.0,
        help="""Seconds an agent whose registration is missing when the hub reads etcd
        again after losing it (etcd restarted, possibly without its data) has to
        register again before it counts as a leave (LOST). Agents register again
        within a third of their lease. A registration that goes away while the hub
        follows etcd (the agent stopped, or its lease expired) is a leave at once.""",
    ).tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        self._tls = TLSFiles.from_config(self.tls)
        self.agents: dict[str, dict] = {}  # agent id -> its registration, as etcd has it
        self.storage_proxies: dict[str, dict] = {}
        self.settings: dict[str, object] = {}  # setting -> the value from etcd in force
        self._rejoin: dict[str, asyncio.TimerHandle] = {}  # agents given time to register again
        self._joined: set[str] = set()  # agents whose join listeners heard (vouched for)
        self._unvouched: dict[str, asyncio.TimerHandle] = {}  # registrations asked again later
        self._agent_lock = asyncio.Lock()  # one registration of an agent applied at a time
        self._configured: dict[str, object] = {}  # setting -> the hub's own value
        self._listeners: list[Listener] = []
        self._task: asyncio.Task | None = None
        self._manager = None
        self._synced = asyncio.Event()
        self.resyncs = 0  # how many times the prefix was read (1 + reconnects)
        self._heartbeats: HeartbeatWriter | None = None

    def tls_files(self) -> TLSFiles | None:
        return self._tls

    # -- following joins and leaves ---------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def changes(self) -> AsyncIterator[tuple[str, str, dict]]:
        queue: asyncio.Queue = asyncio.Queue()

        async def put(kind, agent_id, info):
            queue.put_nowait((kind, agent_id, info))

        self.subscribe(put)
        try:
            while True:
                yield await queue.get()
        finally:
            self._listeners.remove(put)

    # -- running -----------------------------------------------------------------

    async def read_settings(self, manager) -> None:
        """Apply the cluster-wide settings in etcd once, before the manager starts
        (so that e.g. ``default_vfolder_host`` holds for the first defaults); no-op
        without ``etcd_url``, a warning if etcd cannot be reached (``start``'s
        watch applies them once it can)."""
        if not self.etcd_url:
            return
        self._manager = manager
        prefix = self.etcd_prefix.rstrip("/").encode() + SETTINGS.encode()
        client = etcd_client(self.etcd_url)
        try:
            async with asyncio.timeout(10):
                await client.connect()
            async with asyncio.timeout(10):
                snap = await client.get_prefix(prefix)
            for kv in snap:
                self._setting(kv.key[len(prefix):].decode(errors="replace"), kv.value)
        except Exception as e:
            self.log.warning("cluster settings could not be read from etcd at %s (%s); "
                             "using the hub's configuration until it can", self.etcd_url, e)
        finally:
            try:
                await client.close()
            except Exception:
                pass

    async def start(self, manager) -> None:
        """Begin following etcd (no-op without ``etcd_url``); returns once the prefix
        was read the first time, or after 10 s if etcd cannot be reached."""
        if not self.etcd_url:
            return
        self._manager = manager
        self._task = asyncio.create_task(self._follow())
        if not await wait_set(self._synced, 10):
            self.log.warning("etcd at %s not reachable yet; following it in the background", self.etcd_url)

    # -- container registries (manager/registries.py writes them here) ---------------

    def _registry_key(self, name: str) -> bytes:
        return f"{self.etcd_prefix.rstrip('/')}{REGISTRIES}{name}".encode()

    async def _kv(self):
        """A client of the cluster's etcd for one change; ServiceUnavailable, in words,
        when etcd cannot be reached (nothing is changed then)."""
        client = etcd_client(self.etcd_url)
        try:
            async with asyncio.timeout(10):
                await client.connect()
                await client.status()
        except (Exception, TimeoutError) as e:
            await client.close()
            raise ServiceUnavailable(f"etcd at {self.etcd_url} cannot be reached "
                                     f"({type(e).__name__}); nothing was changed") from None
        return client

    async def put_registry(self, name: str, conf: dict, create: bool = False) -> bool:
        """Write registry ``name``'s settings; ``create``: only where no key is (one
        transaction), False when there was one."""
        key, value = self._registry_key(name), json.dumps(conf).encode()
        client = await self._kv()
        try:
            if not create:
                await client.put(key, value)
                return True
            ok, _ = await client.transaction(
                compare=[client.transactions.version(key) == 0],
                success=[client.transactions.put(key, value)], failure=[])
            return bool(ok)
        finally:
            await client.close()

    async def update_registry(self, name: str, change) -> dict | None:
        """Registry ``name``'s settings changed by ``change(old) -> new``, written only
        where nobody wrote them in between (tried again then); None where there is none."""
        key = self._registry_key(name)
        client = await self._kv()
        try:
            for _ in range(5):
                got = await client.get(key)
                if got is None:
                    return None
                new = change(json.loads(got.value))
                ok, _ = await client.transaction(
                    compare=[client.transactions.value(key) == got.value],
                    success=[client.transactions.put(key, json.dumps(new).encode())],
                    failure=[])
                if ok:
                    return new
            raise RuntimeError(f"registry {name!r} in etcd kept changing; try again")
        finally:
            await client.close()

    async def delete_registry(self, name: str) -> bool:
        client = await self._kv()
        try:
            return bool(await client.delete(self._registry_key(name)))
        finally:
            await client.close()

    async def _registry(self, name: str, value: bytes | None) -> None:
        """Mirror one registry of etcd into the record (gone: with its images)."""
        ops = self._manager.ops
        if value is None:
            if await ops.drop_registry(name):
                self.log.info("container registry %s removed (from etcd)", name)
            return
        try:
            conf = json.loads(value)
            if not isinstance(conf, dict):
                raise InvalidRequest("not a JSON object")
            _, conf = registries.new_registry({**conf, "name": name})  # checked as the API does
        except (ValueError, InvalidRequest) as e:
            self.log.error("container registry %s in etcd refused (%s); the record keeps its "
                           "last good settings, if any", name,
                           getattr(e, "detail", None) or e)
            return
        await ops.store_registry(name, conf, "mirror")

    # -- heartbeats ----------------------------------------------------------------

    async def record_heartbeat(self, manager, info: dict) -> str | None:
        """Record an agent's heartbeat; return its status before (None: it is new).

        In cluster mode on PostgreSQL a routine heartbeat (an ALIVE agent, same group)
        is one ``UPDATE`` in autocommit on a connection kept for heartbeats, in a
        thread of its own (:class:`HeartbeatWriter`); anything else (a join, a return
        from LOST, a move) and every other setup goes through the manager's
        ``upsert_agent`` transaction."""
        if self._heartbeats is None and manager.redis_url and manager.engine.dialect.name == "postgresql" \
                and manager.engine.dialect.driver == "psycopg2":
            self._heartbeats = HeartbeatWriter(manager.engine)
        if self._heartbeats is not None:
            try:
                if await self._heartbeats.write(info):
                    return AgentStatus.ALIVE
            except Exception as e:  # the database restarting: the regular path says
                (self.log.debug if self._heartbeats.failures else self.log.warning)(
                    "heartbeat of %s on the heartbeat connection failed (%s); "
                    "written the regular way", info.get("id"), e)
                self._heartbeats.failures += 1
        return await manager.db(upsert_agent, info)

    async def stop(self) -> None:
        for timers in (self._rejoin, self._unvouched):
            for timer in timers.values():
                timer.cancel()
            timers.clear()
        hb, self._heartbeats = self._heartbeats, None
        if hb is not None:
            await hb.close()
        await stop_task(self._task)
        self._task = None

    async def _follow(self) -> None:
        prefix = self.etcd_prefix.rstrip("/").encode()
        failures = 0
        while True:
            client = etcd_client(self.etcd_url)
            try:
                await client.connect()
                snap = await client.get_prefix(prefix + b"/")
                revision = snap.header.revision
                current = {kv.key: kv.value for kv in snap}
                await self._resync(prefix, current)
                self.resyncs += 1
                self._synced.set()
                failures = 0
                watch = await client.watch_prefix(prefix + b"/", start_revision=revision + 1)
                async for ev in watch:
                    await self._apply(prefix, ev.kv.key, ev.kv.value if ev.kind == "PUT" else None)
                raise ConnectionError("the etcd watch ended")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                if failures == 1:
                    self.log.warning("following etcd at %s failed (%s); retrying", self.etcd_url, e)
                await asyncio.sleep(min(0.2 * failures, 2.0))
            finally:
                try:
                    await client.close()
                except Exception:
                    pass

    async def _resync(self, prefix: bytes, current: dict[bytes, bytes]) -> None:
        """Apply the difference between what is in etcd now and what was known."""
        known = {f"{AGENTS}{a}": 1 for a in self.agents} | {
            f"{STORAGE_PROXIES}{p}": 1 for p in self.storage_proxies
        } | {f"{SETTINGS}{n}": 1 for n in self.settings}
        for key, value in current.items():
            await self._apply(prefix, key, value)
        present = {k[len(prefix):].decode(errors="replace") for k in current}
        # etcd decides which registries there are: the record's others go.
        for name in await self._manager.ops.registry_names():
            if f"{REGISTRIES}{name}" not in present:
                self.log.warning("container registry %s is in the record but not in etcd: "
                                 "removed, with its images", name)
                await self._registry(name, None)
        for rel in known:
            if rel in present:
                continue
            if rel.startswith(AGENTS):
                # etcd may have come back without its data: the agent registers again
                # within its lease's refresh; only one that does not is a leave.
                agent_id = rel[len(AGENTS):]
                if agent_id not in self._rejoin:
                    self._rejoin[agent_id] = asyncio.get_running_loop().call_later(
                        self.rejoin_grace, self._rejoin_missed, prefix, agent_id)
                continue
            await self._apply(prefix, prefix + rel.encode(), None)

    def _rejoin_missed(self, prefix: bytes, agent_id: str) -> None:
        """The grace passed without a new registration of ``agent_id``: a leave."""
        if self._rejoin.pop(agent_id, None) is not None:
            self._manager.background(self._agent_logged(agent_id, None))

    def _revouch(self, agent_id: str, value: bytes, info: dict, delay: float) -> None:
        """Ask again whether the agent of a registration not vouched for yet answers,
        while that registration stands (a new one, or its removal, cancels this)."""
        self._unvouched.pop(agent_id, None)  # a timer replaced or dropped is cancelled
        self._manager.background(self._agent_logged(agent_id, value, delay, info))

    async def _agent_logged(self, agent_id: str, value: bytes | None, retry: float = 0.0,
                            standing: dict | None = None) -> None:
        try:
            await self._agent(agent_id, value, retry, standing)
        except Exception:
            self.log.exception("etcd registration of agent %s could not be applied", agent_id)

    async def _apply(self, prefix: bytes, key: bytes, value: bytes | None) -> None:
        rel = key[len(prefix):].decode(errors="replace")
        try:
            if rel.startswith(AGENTS):
                await self._agent(rel[len(AGENTS):], value)
            elif rel.startswith(STORAGE_PROXIES):
                self._storage_proxy(rel[len(STORAGE_PROXIES):], value)
            elif rel.startswith(SETTINGS):
                self._setting(rel[len(SETTINGS):], value)
            elif rel.startswith(REGISTRIES):
                await self._registry(rel[len(REGISTRIES):], value)
        except Exception:
            self.log.exception("etcd key %s could not be applied", key.decode(errors="replace"))

    REVOUCH_MAX = 10.0  # seconds between asking again an agent that does not answer

    async def _agent(self, agent_id: str, value: bytes | None, retry: float = 0.0,
                     standing: dict | None = None) -> None:
        """Apply a registration of ``agent_id`` (None: it went); ``standing``: only while
        the registration known is still that one (a retry of one not vouched for)."""
        async with self._agent_lock:  # etcd's watch and the timers below take turns
            if standing is not None and self.agents.get(agent_id) is not standing:
                return  # replaced or gone since
            await self._agent_locked(agent_id, value, retry)

    async def _agent_locked(self, agent_id: str, value: bytes | None, retry: float) -> None:
        mgr = self._manager
        for timers in (self._rejoin, self._unvouched):
            timer = timers.pop(agent_id, None)
            if timer is not None:
                timer.cancel()
        if value is not None:
            info = json.loads(value)
            if info.get("id") != agent_id:
                raise ValueError(f"registration of {agent_id} names agent {info.get('id')!r}")
            self.agents[agent_id] = info
            # A registration is a claim like a heartbeat (anyone who reaches etcd can
            # write one): what is recorded is what the agent answers a direct call.
            vouched = info if agent_id in mgr.local_agents else \
                await mgr.agents.vouch(agent_id, info)
            if vouched is None:
                # Not answering yet (busy, or not listening yet; its heartbeats are checked
                # the same way): asked again, less and less often, while this registration
                # stands; the agent registers only once per lease.
                delay = min(max(2 * retry, 0.5), self.REVOUCH_MAX)
                self._unvouched[agent_id] = asyncio.get_running_loop().call_later(
                    delay, self._revouch, agent_id, value, info, delay)
                return
            before = await mgr.db(upsert_agent, vouched)  # the manager's own registration path
            mgr.wake()
            if before != AgentStatus.ALIVE and agent_id not in mgr.local_agents:
                # New, or back from LOST (it may have restarted): agree with it now,
                # as a heartbeat does.
                mgr.agents.arrived(agent_id)
            # A join is the first registration vouched for, not the first seen: one whose
            # agent did not answer yet (busy, or not listening yet) joins when a later
            # registration of it is vouched for.
            if agent_id not in self._joined:
                self._joined.add(agent_id)
                self.log.info("agent %s joined (%s, %s)", agent_id, info.get("addr"), info.get("resource_group"))
                await self._notify("join", agent_id, info)
            return
        info = self.agents.pop(agent_id, None)
        if info is None:
            return
        # Two witnesses: a registration gone (its lease lapsed while etcd was away, or
        # the agent stopped) makes it LOST only when it does not answer a direct call
        # either; one that answers stays ALIVE and registers again on its own.
        if agent_id not in mgr.local_agents and info.get("addr") \
                and await mgr.agents.answers(agent_id, info["addr"]):
            self.log.warning("agent %s: its etcd registration is gone, but it answers a "
                             "direct call: kept ALIVE until it registers again", agent_id)
            return
        await mgr.db(_mark_lost, agent_id)
        mgr.wake()
        self.log.warning("agent %s left (its etcd registration is gone): LOST", agent_id)
        if agent_id in self._joined:  # listeners hear the leave of an agent they saw join
            self._joined.discard(agent_id)
            await self._notify("leave", agent_id, info)

    def _storage_proxy(self, name: str, value: bytes | None) -> None:
        from ..storageproxy.client import HTTPStorageClient

        registry = self._manager.storage
        if value is None:
            self.storage_proxies.pop(name, None)
            old = registry.clients.pop(name, None)
            if old is not None:
                asyncio.ensure_future(old.close())
            return
        conf = json.loads(value)
        if not conf.get("url"):
            raise ValueError(f"storage proxy {name!r} in etcd has no url")
        tls = TLSFiles.from_config(conf.get("tls")) or (
            self._tls if conf["url"].startswith("https:") else None
        )
        if self.storage_proxies.get(name) == conf and name in registry.clients:
            return
        old = registry.clients.get(name)
        registry.clients[name] = HTTPStorageClient(conf["url"], conf.get("token", ""), tls=tls)
        self.storage_proxies[name] = conf
        if old is not None:
            asyncio.ensure_future(old.close())
        self.log.info("storage proxy %s at %s (from etcd)", name, conf["url"])

    def _setting(self, name: str, value: bytes | None) -> None:
        """One cluster-wide setting put (``value``) or deleted (None) in etcd."""
        mgr = self._manager
        cluster_wide = mgr.traits(cluster=True)
        if name not in cluster_wide:
            self.log.warning("etcd key %s%s ignored: not a cluster-wide setting (those are %s)",
                             SETTINGS, name, ", ".join(sorted(cluster_wide)))
            return
        if value is None:
            if name in self.settings:
                del self.settings[name]
                setattr(mgr, name, self._configured.pop(name))
                self.log.info("cluster setting %s removed from etcd: back to the hub's %r",
                              name, getattr(mgr, name))
                mgr.wake()
            return
        try:
            parsed = json.loads(value)
        except ValueError:
            self.log.error("cluster setting %s in etcd is not JSON (%r); kept %r",
                           name, value[:200], getattr(mgr, name))
            return
        before = getattr(mgr, name)
        try:
            setattr(mgr, name, parsed)  # the trait's own validation
        except TraitError as e:
            self.log.error("cluster setting %s=%r in etcd refused (%s); kept %r",
                           name, parsed, str(e).splitlines()[0], before)
            return
        self._configured.setdefault(name, before)
        self.settings[name] = getattr(mgr, name)
        if before != self.settings[name]:
            self.log.info("cluster setting %s = %r (from etcd)", name, self.settings[name])
        mgr.wake()

    async def _notify(self, kind: str, agent_id: str, info: dict) -> None:
        for listener in list(self._listeners):
            try:
                await listener(kind, agent_id, info)
            except Exception:
                self.log.exception("cluster listener failed on %s of %s", kind, agent_id)


def _mark_lost(s, agent_id: str) -> None:
    from ..models.cluster import Agent

    a = s.get(Agent, agent_id, with_for_update=True)
    if a is not None and a.status == AgentStatus.ALIVE:
        a.status = AgentStatus.LOST


class HeartbeatWriter:
    """Routine heartbeats, written cheaply (benchmarks/agents.py: 200 agents every 5 s).

    Through the manager's ``db()`` a heartbeat cost a worker-thread hop, an ORM session,
    a pool checkout with its ping, the ``UPDATE``, the ``COMMIT`` and the pool's reset
    rollback: four round trips. Here it is one ``UPDATE ... WHERE id = ... AND status =
    'ALIVE' AND resource_group = ...`` in autocommit (one statement is its own
    transaction) on one connection kept for heartbeats, run by one thread: heartbeats
    are serialised, as the event consumer delivers them one after the other anyway. A
    heartbeat that matches no row (a new agent, one back from LOST, a group change)
    returns False: the caller takes the full upsert path.
    """

    SQL = (
        "UPDATE agents SET addr = %s, architecture = %s, backend = %s, version = %s, "
        "available_slots = %s::json, last_heartbeat = %s, images = %s::json, "
        "pool_ready = %s::json, away_slots = %s::json "
        "WHERE id = %s AND status = %s AND resource_group = %s"
    )

    def __init__(self, engine):
        from concurrent.futures import ThreadPoolExecutor

        from ..models.cluster import Agent

        self.engine = engine
        self._slots = Agent.__table__.c.available_slots.type.bind_processor(engine.dialect)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bai-heartbeats")
        self._conn = None
        self._closed = False
        self.failures = 0

    async def write(self, info: dict) -> bool:
        if self._closed:
            return False
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._write, info)

    def _connect(self):
        conn = self.engine.raw_connection()
        raw = conn.dbapi_connection
        conn.detach()  # ours until close(): never handed to anyone else in autocommit
        try:
            raw.rollback()  # the pool's ping opened a transaction
            raw.autocommit = True
        except Exception:
            raw.close()
            raise
        return raw

    def _write(self, info: dict) -> bool:
        from ..common.slots import ResourceSlot
        from ..models.base import utcnow
        from .reconcile import _holdings

        if self._closed:
            return False
        held = _holdings(info)  # an agent that does not say: NULL (unknown)
        params = (
            info.get("addr", ""), info.get("architecture", ""), info.get("backend", ""),
            info.get("version", ""), self._slots(ResourceSlot.from_json(info["available_slots"])),
            utcnow(), *(json.dumps(held.get(k)) for k in ("images", "pool_ready", "away_slots")),
            info["id"], AgentStatus.ALIVE, info["resource_group"],
        )
        if self._conn is None:
            self._conn = self._connect()
        try:
            cur = self._conn.cursor()
            try:
                cur.execute(self.SQL, params)
                return cur.rowcount == 1
            finally:
                cur.close()
        except Exception:
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    async def close(self) -> None:
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._pool, self._drop)
        self._pool.shutdown(wait=False)
