"""The session lifecycle, driven by the record.

Every status change and every slot change of a session goes through this package
(:mod:`.record`, each inside the caller's transaction, the session row locked), except
the scheduler's placement commit (PENDING -> SCHEDULED or CANCELLED, written in bulk by
:mod:`..scheduler.allocator`). What drives a session forward is what the record says,
never a task's memory: each scheduler loop the :class:`.driver.Driver` hands the
sessions whose step nobody drives to the handler of their row (:mod:`.handlers`), the
way Backend.AI's Sokovan handlers do.

| status | handler | what it does |
|---|---|---|
| PENDING | the scheduler (``manager/scheduler/``) | places it (SCHEDULED) or cancels it with the reason |
| SCHEDULED | :class:`~.handlers.Start` | claims it, then PREPARING -> CREATING -> RUNNING, every kernel or none (:mod:`.start`) |
| PREPARING, CREATING | :class:`~.handlers.InterruptedStart` | the start's owner died, or it took longer than ``start_deadline``: removes what was created, retries or fails with the reason |
| TERMINATING | :class:`~.handlers.Termination` | the end's owner died: removes the kernels, ends with the recorded ``end_status`` |
| RUNNING on a LOST agent | :class:`~.handlers.LostAgent` | says so in ``status_info``; after ``agent_lost_grace`` ends it (ERROR) and frees its slots; an agent that returns in time keeps it |
| RUNNING, a kernel ended | :class:`~.handlers.KernelExit` | ends it as the kernel's exit says |
| RUNNING batch past ``batch_timeout`` | :class:`~.handlers.BatchTimeout` | ends it (ERROR, FAILURE) |
| RUNNING past a keypair policy's limits | :class:`~.handlers.PolicyLimits` | ends it (idle_timeout, max_session_lifetime) |
| any alive, ``awaited_until`` past | :class:`~.handlers.Abandoned` | JupyterHub no longer waits for it (the hub died while it started): ends it |
| RUNNING in an SSH group, its keypair or user without access | :class:`~.handlers.SSHWithdrawal` | takes the session's SSH key away (no status change; the session runs on) |

Claims (:mod:`.claims`): a step is driven by the manager process that holds the
session's claim; of several managers on one database exactly one wins it.
"""

from .claims import new_owner_id, owner_gone, owner_is_dead
from .driver import Driver
from .events import SessionEvents
from .record import FAILURE, LOST_MARK, SUCCESS, kernels_on, load_session

__all__ = [
    "FAILURE",
    "LOST_MARK",
    "SUCCESS",
    "Driver",
    "SessionEvents",
    "kernels_on",
    "load_session",
    "new_owner_id",
    "owner_gone",
    "owner_is_dead",
]
