"""Deciding one scheduler pass in memory (:func:`run_pipeline`): the sequencer's order,
the validators, the agent selector and the allocator, with the starvation guard's
reservations (:func:`starving_first`) and the words a waiting session is given. No
database here: :mod:`.dispatcher` reads the snapshot, calls this and writes the result
back, and reuses the guard, the shapes and the messages in its shorter passes."""

from __future__ import annotations

import logging
from decimal import Decimal

from .agent_selectors import SELECTORS
from .allocator import Allocation, PlacementWriter
from .pool import AgentPool
from .sequencers import SEQUENCERS
from .state import PassContext, PendingSession, Verdict
from .validators import validate

log = logging.getLogger("jupyterhub_backendai.scheduler")


def run_pipeline(ctx: PassContext, pending: list[PendingSession], pool: AgentPool,
                 writer: PlacementWriter | None = None) -> Allocation:
    """Decide the pass in memory: what is placed where, what waits and why, what is
    cancelled. With a ``writer``, placements are handed to it in batches as they are made."""
    opts = ctx.options
    alloc = Allocation(writer=writer)
    sequencer = SEQUENCERS.get(ctx.group.scheduler)
    if sequencer is None:
        log.warning("resource group %s: unknown scheduler %r, using fifo",
                    ctx.group.name, ctx.group.scheduler)
        sequencer = SEQUENCERS["fifo"]
    selector = SELECTORS[opts.agent_selector]

    live = []
    for s in pending:
        if opts.pending_timeout > 0 and ctx.waited(s) > opts.pending_timeout:
            alloc.cancelled.append((s, Verdict(
                "pending_timeout",
                f"cancelled: pending timeout: not scheduled within {opts.pending_timeout} s",
                cancel=True,
            )))
        else:
            live.append(s)

    def reject(s: PendingSession, verdict: Verdict) -> None:
        (alloc.cancelled if verdict.cancel else alloc.waiting).append((s, verdict))

    # Starvation guard: the oldest sessions past the threshold go first and, if
    # they do not fit, get agents held for them.
    done = starving_first(
        ctx, sorted((s for s in live if ctx.waited(s) >= opts.starvation_threshold),
                    key=lambda s: (s.created_at, s.id)) if opts.max_reservations > 0 else (),
        pool, alloc, selector)
    alloc.guarded = bool(done)

    # The queue, in the sequencer's order; what does not fit is skipped (backfilling).
    failed_shapes = alloc.failed_shapes
    shape_of = Shapes(pool)

    rest = [s for s in live if s.id not in done] if done else live
    for s in sequencer.sequence(rest, ctx):
        verdict = validate(s, ctx)
        if verdict is not None:
            reject(s, verdict)
            continue
        shape = shape_of(s)
        # Within a pass free capacity only shrinks: a shape that failed fails again.
        msg = failed_shapes.get(shape)
        if msg is None:
            agents = selector.select(s, pool, ctx)
            if agents is not None:
                alloc.place(s, agents, pool, ctx)
                continue
            msg = failed_shapes[shape] = (
                no_fit_message(s) if ever_fits(s, pool) else never_fits_message(s, pool)
            )
        alloc.waiting.append((s, Verdict("no_resources", msg)))
    return alloc


def starving_first(ctx: PassContext, starving, pool: AgentPool, alloc: Allocation,
                    selector) -> set[str]:
    """The starvation guard: ``starving`` (sessions past the threshold, oldest first)
    are placed or get agents held for them, up to ``max_reservations`` of those that
    pass the validators; the reservations go to ``ctx.group.scheduler_state``. Returns
    the ids it decided (the rest of the pass skips them)."""
    opts = ctx.options
    done: set[str] = set()
    old_res: dict = ctx.group.scheduler_state.get("reservations") or {}
    new_res: dict[str, list[str]] = {}
    if opts.max_reservations > 0:
        for s in starving:
            # Only the oldest few go first: the others keep the sequencer's order
            # (after an outage everything is "old"; DRF or priority must still apply).
            if len(done) >= opts.max_reservations:
                break
            if validate(s, ctx) is not None:
                continue  # not starved by others: it waits on its own limits (handled below)
            done.add(s.id)
            agents = selector.select(s, pool, ctx)
            if agents is not None:
                alloc.place(s, agents, pool, ctx)
                continue
            held = _keep_reservation(s, old_res.get(s.id), pool) or _choose_reservation(s, pool)
            if held is None:
                alloc.waiting.append((s, Verdict("no_resources", never_fits_message(s, pool))))
                continue
            pool.hold(held)
            new_res[s.id] = held
            alloc.waiting.append((s, Verdict(
                "no_resources",
                f"{no_fit_message(s)}; reserved agent(s) {', '.join(sorted(set(held)))} "
                f"for it (waiting since {s.created_at.isoformat(timespec='seconds')})",
            )))
    if new_res or old_res:
        if new_res:
            ctx.group.scheduler_state["reservations"] = new_res
        else:
            ctx.group.scheduler_state.pop("reservations", None)
    return done


class Shapes:
    """A session -> the key of its request (cluster mode, each kernel's slot vector,
    architecture, designated agents): sessions with equal keys fit or fail alike."""

    def __init__(self, pool: AgentPool):
        self.pool = pool
        self.vectors: dict[int, tuple] = {}  # id(slots) -> (slots, vector): kernels share slots

    def vector(self, slots) -> tuple:
        got = self.vectors.get(id(slots))
        if got is None or got[0] is not slots:
            got = self.vectors[id(slots)] = (slots, self.pool.vector(slots))
        return got[1]

    def __call__(self, s: PendingSession) -> tuple:
        return (s.cluster_mode, tuple(self.vector(slots) for _, slots in s.kernels),
                s.architecture, s.designated_agents)


def _where(s: PendingSession) -> str:
    parts = []
    if s.architecture:
        parts.append(f"architecture {s.architecture}")
    if s.designated_agents:
        parts.append(f"among designated agents {', '.join(s.designated_agents)}")
    return (" (" + "; ".join(parts) + ")") if parts else ""


def no_fit_message(s: PendingSession) -> str:
    if s.cluster_mode == "multi-node" and len(s.kernels) > 1:
        per = s.kernels[0][1].nonzero().describe()
        return (f"waiting for resources: no {len(s.kernels)} distinct agents have "
                f"{per} free each{_where(s)}")
    return f"waiting for resources: no agent has {s.need.describe()} free{_where(s)}"


def never_fits_message(s: PendingSession, pool: AgentPool) -> str:
    return (f"waiting for resources: no agent of the group is large enough for "
            f"{s.need.describe()} ({s.cluster_mode}, {len(s.kernels)} kernel(s)){_where(s)}")


def _eligible(s: PendingSession, pool: AgentPool, aid: str) -> bool:
    a = pool.agents.get(aid)
    return (
        a is not None
        and pool.indexed(aid)
        and (s.architecture is None or a.architecture == s.architecture)
        and (not s.designated_agents or aid in s.designated_agents)
    )


def _capacity_plan(s: PendingSession, pool: AgentPool, rank) -> list[str] | None:
    """Agents whose *capacity* can hold the session, best ``rank`` first."""
    multi = s.cluster_mode == "multi-node" and len(s.kernels) > 1
    demands = [slots for _, slots in s.kernels] if multi else [s.need]
    ids = sorted((aid for aid in pool.agents if _eligible(s, pool, aid)), key=rank)
    chosen: list[str] = []
    for need in demands:
        aid = next((a for a in ids if a not in chosen and need.fits_in(pool.agents[a].available)),
                   None)
        if aid is None:
            return None
        chosen.append(aid)
    return chosen if multi else chosen * len(s.kernels)


def ever_fits(s: PendingSession, pool: AgentPool) -> bool:
    return _capacity_plan(s, pool, rank=lambda aid: aid) is not None


def _shortfall(s: PendingSession, pool: AgentPool):
    need = pool.vector(s.kernels[0][1] if s.cluster_mode == "multi-node" else s.need)

    def rank(aid: str):
        free = pool.vector(pool.agents[aid].free)
        return tuple(max(Decimal(0), n - f) for n, f in zip(need, free, strict=True)) + (aid,)

    return rank


def _choose_reservation(s: PendingSession, pool: AgentPool) -> list[str] | None:
    """The agents closest to holding ``s`` (least shortfall by resource priority)."""
    if not s.kernels:
        return None
    return _capacity_plan(s, pool, rank=_shortfall(s, pool))


def _keep_reservation(s: PendingSession, held: list[str] | None, pool: AgentPool):
    """Keep last pass's reservation while its agents are still usable, so that
    freed capacity accumulates on the same agents."""
    if not held or len(held) != len(s.kernels):
        return None
    multi = s.cluster_mode == "multi-node" and len(s.kernels) > 1
    if any(not _eligible(s, pool, aid) for aid in held):
        return None
    if multi:
        if len(set(held)) != len(held) or not all(
            slots.fits_in(pool.agents[aid].available) for (_, slots), aid in zip(s.kernels, held, strict=True)
        ):
            return None
    elif len(set(held)) != 1 or not s.need.fits_in(pool.agents[held[0]].available):
        return None
    return list(held)
