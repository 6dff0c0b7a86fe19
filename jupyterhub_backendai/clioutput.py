"""``backendai-admin``'s output for people: a table for a list (the columns that say
most), field and value for one item, slots in human units, times to the minute in UTC.
``--json`` bypasses it (:mod:`.cli`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .common.errors import BackendAIError

# The columns a list shows, per command (those its items have); others: every field
# whose value is a scalar. `--json` gives everything.
COLUMNS: dict[str, tuple[str, ...]] = {
    "domains": ("name", "is_active", "total_resource_slots", "description"),
    "projects": ("id", "name", "domain_name", "is_active", "total_resource_slots"),
    "users": ("id", "username", "email", "role", "domain_name", "status"),
    "keypairs": ("access_key", "user_id", "is_active", "is_default", "rate_limit",
                 "resource_policy", "last_used"),
    "keypair-resource-policies": ("name", "total_resource_slots", "max_concurrent_sessions",
                                  "idle_timeout", "max_session_lifetime",
                                  "max_lifetime_extension"),
    "resource-groups": ("name", "is_active", "is_public", "scheduler", "description"),
    "resource-presets": ("name", "resource_slots", "resource_group", "description"),
    "agents": ("id", "status", "resource_group", "schedulable", "available_slots",
               "occupied_slots", "last_heartbeat"),
    "sessions": ("id", "name", "type", "status", "image", "requested_slots", "created_at"),
    "vfolders": ("id", "name", "host", "ownership_type", "status"),
    "usage": ("name", "sessions", "hours", "cpu_hours", "mem_gib_hours", "gpu_hours",
              "used_cpu_hours", "used_mem_gib_hours"),
}
_ISO_RE = re.compile(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d)(:\d\d(\.\d+)?)?(Z|[+-]00:?00)?$")


def cell(key: str, value: Any) -> str:
    """One value in words: yes/no, '-' for none, slots in human units, a time to the
    minute (UTC), anything nested as compact JSON."""
    from .common.slots import format_slots

    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict) and key.endswith("slots"):
        try:
            return format_slots(value) if value else "-"
        except (ValueError, TypeError, ArithmeticError, BackendAIError):
            pass
    if isinstance(value, str):
        m = _ISO_RE.match(value)
        return f"{m.group(1)} {m.group(2)} UTC" if m else value
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def table(items: list[dict], columns: tuple[str, ...] | None = None) -> str:
    """Rows under a header, columns padded to their widest cell."""
    if not items:
        return "(none)"
    keys = [c for c in columns or () if any(c in it for it in items)]
    if not keys:
        keys = [k for k, v in items[0].items() if not isinstance(v, dict | list)]
    rows = [[k.upper().replace("_", " ") for k in keys]]
    rows += [[cell(k, it.get(k)) for k in keys] for it in items]
    widths = [max(len(r[i]) for r in rows) for i in range(len(keys))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def render(out: Any, cmd: str | None = None) -> str:
    """What a command got, for people: a list as a table (and how many of how many),
    one item as its fields and values, anything else as it is."""
    if out is None:
        return "done"
    if isinstance(out, dict) and isinstance(out.get("items"), list) and all(
            isinstance(x, dict) for x in out["items"]):
        if isinstance(out.get("total"), dict):  # a report: its rows, then the totals
            return table([*out["items"], {"name": "Total", **out["total"]}],
                         COLUMNS.get(cmd or ""))
        text = table(out["items"], COLUMNS.get(cmd or ""))
        total = out.get("total")
        if isinstance(total, int) and out["items"]:
            first = int(out.get("offset") or 0)
            text += (f"\n({len(out['items'])} of {total})" if first == 0 else
                     f"\n({first + 1}-{first + len(out['items'])} of {total})")
        return text
    if isinstance(out, list) and all(isinstance(x, dict) for x in out):
        return table(out, COLUMNS.get(cmd or ""))
    if isinstance(out, dict):
        width = max((len(k) for k in out), default=0)
        lines = []
        for k, v in out.items():
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                lines.append(f"{k}:")
                lines.extend("  " + line for line in table(v).splitlines())
            else:
                lines.append(f"{k.ljust(width)}  {cell(k, v)}")
        return "\n".join(lines)
    return str(out)

