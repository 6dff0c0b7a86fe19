"""What this process drives right now: at most one task per (kind, session).

One registry instead of a dict or set per concern. The driver skips a session this
process drives, :meth:`BackendAIManager.stop` cancels every step, the claims renewed
are those of the running starts and ends, and a reconciliation leaves a session alone
while one of its steps runs here.

Kinds:

- ``start``: SCHEDULED -> PREPARING -> CREATING -> RUNNING (:mod:`.start`)
- ``end``: a session being ended (:mod:`.ending`); a second end of the same session
  waits for the first, then finds it dead
- ``ending``: an end started in the background by a handler (timeouts, policy
  limits, a lost agent, an abandoned server), so that no handler ends a session twice
- ``timer``: a batch session's timeout
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine

START = "start"
END = "end"
ENDING = "ending"
TIMER = "timer"


class Steps:
    def __init__(self) -> None:
        self._steps: dict[tuple[str, str], asyncio.Future] = {}

    def get(self, kind: str, sid: str) -> asyncio.Future | None:
        return self._steps.get((kind, sid))

    def driving(self, sid: str) -> bool:
        """Whether this process starts or ends ``sid`` right now."""
        return (START, sid) in self._steps or (END, sid) in self._steps

    def sessions(self, *kinds: str) -> list[str]:
        return [sid for kind, sid in self._steps if kind in kinds]

    def spawn(self, kind: str, sid: str, coro: Coroutine) -> asyncio.Task | None:
        """Run ``coro`` as the ``kind`` step of ``sid``, unless one runs already (then
        ``coro`` is closed unrun and None returned)."""
        if (kind, sid) in self._steps:
            coro.close()
            return None
        task = asyncio.create_task(coro)
        self._steps[(kind, sid)] = task
        task.add_done_callback(lambda t: self._forget(kind, sid, t))
        return task

    def replace(self, kind: str, sid: str, coro: Coroutine) -> asyncio.Task:
        """Run ``coro`` as the ``kind`` step of ``sid``, cancelling the one before."""
        old = self._steps.pop((kind, sid), None)
        if old is not None:
            old.cancel()
        task = self.spawn(kind, sid, coro)
        assert task is not None
        return task

    @contextlib.asynccontextmanager
    async def exclusive(self, kind: str, sid: str):
        """Run the block as the ``kind`` step of ``sid`` in the caller's task, after
        any such step in flight has finished."""
        while (inflight := self._steps.get((kind, sid))) is not None:
            await asyncio.wait({inflight})
        done = asyncio.get_running_loop().create_future()
        self._steps[(kind, sid)] = done
        try:
            yield
        finally:
            self._forget(kind, sid, done)
            done.set_result(None)

    async def cancel(self, kind: str, sid: str) -> None:
        """Cancel the ``kind`` step of ``sid`` (unless it is the caller) and wait for it."""
        step = self._steps.get((kind, sid))
        if step is None or step is asyncio.current_task() or not isinstance(step, asyncio.Task):
            return
        self._steps.pop((kind, sid), None)
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await step

    def cancel_all(self) -> None:
        for step in list(self._steps.values()):
            if isinstance(step, asyncio.Task):
                step.cancel()

    def _forget(self, kind: str, sid: str, step: asyncio.Future) -> None:
        if self._steps.get((kind, sid)) is step:
            del self._steps[(kind, sid)]
