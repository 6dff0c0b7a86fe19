"""Background tasks of long-lived objects (registrations, watchers), and waiting on their events."""

from __future__ import annotations

import asyncio


async def stop_task(task: asyncio.Task | None) -> None:
    """Cancel ``task`` and wait until it has ended; how it ended (cancelled, or an
    error it raised meanwhile) is of no more interest to a caller that is stopping."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set (True) or ``timeout`` seconds pass (False)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
        return True
    except TimeoutError:
        return False
