"""Errors a user can cause carry an HTTP status and a message meant for that user."""

from __future__ import annotations


class BackendAIError(Exception):
    status_code = 500
    title = "Internal error"

    def __init__(self, detail: str = "", *, status_code: int | None = None):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        if status_code is not None:
            self.status_code = status_code


class InvalidRequest(BackendAIError):
    status_code = 400
    title = "Invalid request"


class Unauthorized(BackendAIError):
    """No valid credentials: missing, malformed, wrong signature, stale date, unknown or inactive key."""

    status_code = 401
    title = "Unauthorized"


class NotFound(BackendAIError):
    status_code = 404
    title = "Not found"


class Forbidden(BackendAIError):
    status_code = 403
    title = "Forbidden"


class Conflict(BackendAIError):
    status_code = 409
    title = "Conflict"


class QuotaExceeded(BackendAIError):
    status_code = 412
    title = "Quota exceeded"


class StorageQuotaExceeded(QuotaExceeded):
    """A write through the storage proxy would take a quota scope over its limit."""

    status_code = 413
    title = "Storage quota exceeded"


class TooManyRequests(BackendAIError):
    status_code = 429
    title = "Too many requests"


class AgentError(BackendAIError):
    """The agent could not do what the manager asked (its message says why)."""

    status_code = 500
    title = "Agent error"


class ImageNotFound(AgentError):
    status_code = 400
    title = "Unknown image"


class ServiceUnavailable(BackendAIError):
    """A part the hub needs (its database) does not answer now: try again later. Never
    a 401/403, so that clients keep credentials that are still good."""

    status_code = 503
    title = "Service unavailable"
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
