"""Errors a user can cause carry an HTTP status and a message meant for that user."""

from __future__ import annotations


class BackendAIError(Exception):
    """An error with its HTTP status and a title; ``detail`` is the message for the user.

    A kind of error is declared in one line: ``class Gone(BackendAIError, status=410,
    title="Gone")`` (class attributes ``status_code`` and ``title`` do the same)."""

    status_code = 500
    title = "Internal error"

    def __init_subclass__(cls, *, status: int | None = None, title: str | None = None, **kw):
        super().__init_subclass__(**kw)
        if status is not None:
            cls.status_code = status
        if title is not None:
            cls.title = title

    def __init__(self, detail: str = "", *, status_code: int | None = None):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        if status_code is not None:
            self.status_code = status_code


class InvalidRequest(BackendAIError, status=400, title="Invalid request"):
    """The request's shape or values are wrong."""


class Unauthorized(BackendAIError, status=401, title="Unauthorized"):
    """No valid credentials: missing, malformed, wrong signature, stale date, unknown or inactive key."""


class NotFound(BackendAIError, status=404, title="Not found"):
    """No such thing, or none the caller may see."""


class Forbidden(BackendAIError, status=403, title="Forbidden"):
    """The caller is known but may not do this."""


class Conflict(BackendAIError, status=409, title="Conflict"):
    """The record's state does not allow it now (a name taken, a status that forbids it)."""


class QuotaExceeded(BackendAIError, status=412, title="Quota exceeded"):
    """A limit of a policy would be passed."""


class StorageQuotaExceeded(QuotaExceeded, status=413, title="Storage quota exceeded"):
    """A write through the storage proxy would take a quota scope over its limit."""


class TooManyRequests(BackendAIError, status=429, title="Too many requests"):
    """The rate limit of the caller's keypair is spent for now."""


class AgentError(BackendAIError, status=500, title="Agent error"):
    """The agent could not do what the manager asked (its message says why)."""


class DevicesHeldElsewhere(AgentError, status=409, title="Devices held elsewhere"):
    """A kernel's GPUs would be free but another agent of the host (another
    installation on the same GPUs) holds them now: not the start's fault, so it goes
    back to the queue without counting as a try, and waits there for them."""


class KernelCannotStart(AgentError, status=500, title="Kernel cannot start"):
    """The agent cannot start this kernel however often it is asked: its own setup is in
    the way (a local kernel user who cannot reach the Python environment or the working
    folder). The message says what to change; the start is not retried."""


class ImageNotFound(AgentError, status=400, title="Unknown image"):
    """No agent of the group has the image the request names."""


class PullRefused(KernelCannotStart, status=502, title="Image pull refused"):
    """The registry refused an image's pull for good (wrong credentials, a certificate
    the engine does not trust): asked again, it answers the same, so the start is not
    retried (issue 25). A registry that cannot be reached is an :class:`AgentError`."""


class ImageNotInRegistry(ImageNotFound, PullRefused, status=400, title="Unknown image"):
    """The registry has no such repository or tag: not retried either."""


class ServiceUnavailable(BackendAIError, status=503, title="Service unavailable"):
    """A part the hub needs (its database) does not answer now: try again later. Never
    a 401/403, so that clients keep credentials that are still good."""

    retry_after = 5

    @property
    def headers(self) -> dict:
        return {"Retry-After": str(self.retry_after)}


def outage(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 that ``exc`` means, when it is the database not answering (a connection
    refused, lost or timed out); None for any other error."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(exc, OperationalError) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated):
        text = str(getattr(exc, "orig", exc)).lower()
        if "locked" in text and "database" in text:  # SQLite busy: not an outage
            return None
        return ServiceUnavailable("the hub's database does not answer; try again in a moment")
    return None
