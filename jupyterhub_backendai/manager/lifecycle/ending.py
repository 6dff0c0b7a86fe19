"""Ending a session: whatever it has become, its kernels removed and its slots freed."""

from __future__ import annotations

from ...agent.backends.base import BATCH
from ...common.errors import BackendAIError
from ...common.types import DEAD_STATUSES, SessionStatus
from . import record
from .start import fault_hold
from .steps import END, START, TIMER


class Ending:
    def __init__(self, driver) -> None:
        self.driver = driver
        self.mgr = driver.mgr

    async def end(self, sid: str, status: str = SessionStatus.TERMINATED, info: str = "stopped",
                  *, result: str | None = None) -> None:
        """Stop whatever the session has become, remove its kernels, free its slots.

        ``result`` (SUCCESS / FAILURE) defaults from ``status``: a stopped
        interactive session succeeded, a batch session stopped before its
        command finished did not, an error is a failure.

        One end per session at a time: a second caller (a user's stop beside a
        batch timeout, say) waits for the one in flight, then finds the session dead.
        Two at once would race, and the one that lost the kernels' logs could end it.
        """
        async with self.driver.steps.exclusive(END, sid):
            await self._end(sid, status, info, result)

    async def _end(self, sid: str, status: str, info: str, result: str | None) -> None:
        mgr, steps = self.mgr, self.driver.steps
        await steps.cancel(START, sid)
        await steps.cancel(TIMER, sid)
        sess = await mgr.db(record.load_session, sid)
        if sess is None or sess.status in DEAD_STATUSES:
            return
        if result is None and sess.session_type == BATCH and status == SessionStatus.TERMINATED:
            result = record.FAILURE
        if sess.status == SessionStatus.PENDING:
            await self.terminate(
                sid,
                SessionStatus.CANCELLED if status == SessionStatus.TERMINATED else status,
                info,
                result=result or record.FAILURE,
            )
            return
        if await mgr.db(record.begin_termination, sid, status, info, mgr.owner_id, mgr.claim_lease):
            mgr.changed(sid, SessionStatus.TERMINATING)
            await fault_hold(mgr.log, SessionStatus.TERMINATING)
        placed = {k.id: k.agent_id for k in sess.kernels if k.agent_id}
        logs: dict[str, str] = {}
        if sess.session_type == BATCH or status == SessionStatus.ERROR:
            # Keep what the kernels printed: a batch session's output, a failure's clues.
            for kid, aid in placed.items():
                try:
                    text = await (await mgr.agents.client_for(aid)).kernel_logs(kid)
                except BackendAIError:
                    text = None
                if text:
                    logs[kid] = text
        await self.driver.starter.destroy_kernels(placed)
        await self.terminate(sid, status, info, result=result, logs=logs)

    async def terminate(self, sid: str, status: str, info: str, result: str | None = None,
                        logs: dict[str, str] | None = None) -> None:
        """Mark dead and free the slots, in one transaction (:func:`.record.terminate`)."""
        mgr = self.mgr
        if await mgr.db(record.terminate, sid, status, info, result, logs):
            mgr.changed(sid, status)
        else:
            mgr.events.changed(sid)
        mgr.wake()
