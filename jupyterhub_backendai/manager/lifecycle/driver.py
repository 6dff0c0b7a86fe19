"""The lifecycle driver: runs the status handlers (:mod:`.handlers`) from what the
record says, and owns this process's steps (:mod:`.steps`)."""

from __future__ import annotations

import asyncio

from ...common.types import SessionStatus
from . import handlers, record
from .ending import Ending
from .start import Starter
from .steps import END, ENDING, START, TIMER, Steps


class Driver:
    def __init__(self, mgr) -> None:
        self.mgr = mgr
        self.steps = Steps()
        self.starter = Starter(self)
        self.ending = Ending(self)
        self.handlers = [cls(self) for cls in handlers.HANDLERS]
        self._by_type = {type(h): h for h in self.handlers}
        self.starter.transition = self._by_type[handlers.Start].transition
        self._renewed = 0.0  # loop time of the last claim renewal

    def handler(self, cls: type[handlers.Handler]) -> handlers.Handler:
        return self._by_type[cls]

    @property
    def policy_limits(self) -> handlers.PolicyLimits:
        return self._by_type[handlers.PolicyLimits]

    async def run(self, stage: str) -> None:
        """Run the handlers of ``stage`` ("before" or "after" the scheduler's pass)."""
        rnd = None
        if stage == "after":
            await self._renew()
            now = record.utcnow()
            rnd = handlers.Round(now, await self.mgr.db_read(record.due_sessions, now))
        else:
            rnd = handlers.Round(record.utcnow(), [])
        for h in self.handlers:
            if h.stage == stage:
                await h.run(rnd)

    async def _renew(self) -> None:
        mgr = self.mgr
        loop_now = asyncio.get_running_loop().time()
        if loop_now - self._renewed >= mgr.claim_lease / 3:
            self._renewed = loop_now
            await mgr.db(record.renew, self.steps.sessions(START, END), mgr.owner_id, mgr.claim_lease)

    # -- what the other rooms ask of the lifecycle --------------------------------------

    def starting(self) -> set[str]:
        """The sessions whose start this process drives now (SCHEDULED to RUNNING)."""
        return set(self.steps.sessions(START))

    def begin_start(self, sid: str) -> None:
        """Start a session the scheduler just placed (SCHEDULED)."""
        self.handler(handlers.Start).begin(sid)

    def end_once(self, sid: str, status: str, info: str, result: str | None = None) -> bool:
        """End ``sid`` in the background unless this process is ending it already;
        True when this call started the end."""
        if self.steps.get(ENDING, sid) is not None or self.steps.get(END, sid) is not None:
            return False
        self.mgr.log.info("ending session %s: %s", sid, info)
        return self.steps.spawn(ENDING, sid, self.ending.end(sid, status, info, result=result)) is not None

    async def end(self, sid: str, status: str = SessionStatus.TERMINATED, info: str = "stopped",
                  *, result: str | None = None) -> None:
        await self.ending.end(sid, status, info, result=result)

    async def kernel_exited(self, kernel_id: str, exit_code: int | None, logs: str | None) -> None:
        await self.handler(handlers.KernelExit).exited(kernel_id, exit_code, logs)

    def arm_batch_timer(self, sid: str, timeout: int | None) -> None:
        if not timeout:
            return

        async def expire():
            await asyncio.sleep(timeout)
            await self.ending.end(sid, SessionStatus.ERROR, "batch timeout", result=record.FAILURE)

        self.steps.replace(TIMER, sid, expire())

    def stop(self) -> None:
        self.steps.cancel_all()
