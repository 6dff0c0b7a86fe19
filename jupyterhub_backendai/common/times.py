"""Times as the record keeps them in text (``status_history``: ISO 8601)."""

from __future__ import annotations

import datetime as dt


def parse_utc(iso) -> dt.datetime | None:
    """``iso`` as an aware time (a naive one is UTC); None when it is empty or not a time."""
    if not iso:
        return None
    try:
        t = dt.datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)
