"""Resource slots: exact (Decimal) amounts of named resources.

Slot names follow Backend.AI: ``cpu`` (cores), ``mem`` (bytes), ``cuda.device``
(whole GPUs). Arithmetic is exact so that freeing exactly what was taken always
returns an agent to zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation

from .errors import InvalidRequest

CPU = "cpu"
MEM = "mem"
CUDA = "cuda.device"
KNOWN_SLOTS = (CPU, MEM, CUDA)

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(value: str | int | Decimal) -> Decimal:
    """Parse a memory size such as ``512m``, ``1.5g``, ``2GiB`` or a byte count."""
    if isinstance(value, bool):
        raise InvalidRequest(f"invalid size: {value!r}")
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, float):
        value = repr(value)
    if not isinstance(value, str):
        raise InvalidRequest(f"invalid size: {value!r}")
    m = _SIZE_RE.match(value)
    if not m:
        raise InvalidRequest(f"invalid size: {value!r} (use e.g. 512m, 2g)")
    return (Decimal(m.group(1)) * _UNITS[m.group(2).lower()]).to_integral_value()


def parse_decimal(name: str, value) -> Decimal:
    if isinstance(value, bool):
        raise InvalidRequest(f"{name} must be a number, not {value!r}")
    try:
        d = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise InvalidRequest(f"{name} must be a number, not {value!r}") from None
    if not d.is_finite():
        raise InvalidRequest(f"{name} must be a finite number, not {value!r}")
    return d


def format_size(b: Decimal) -> str:
    b = Decimal(b)
    for unit in ("t", "g", "m", "k"):
        if b >= _UNITS[unit] and b % _UNITS[unit] == 0:
            return f"{b // _UNITS[unit]}{unit}"
    return str(b)


class ResourceSlot(dict):
    """A mapping slot name -> Decimal with element-wise arithmetic.

    Missing keys count as zero, so ``{"cpu": 1} <= {"cpu": 2, "mem": 1}`` holds.
    """

    def __init__(self, data: Mapping | Iterable = (), **kw):
        super().__init__()
        for k, v in dict(data, **kw).items():
            self[k] = Decimal(v) if not isinstance(v, Decimal) else v

    @classmethod
    def from_json(cls, data: Mapping | None) -> ResourceSlot:
        return cls({k: Decimal(str(v)) for k, v in (data or {}).items()})

    def to_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in sorted(self.items())}

    def __add__(self, other: Mapping) -> ResourceSlot:
        keys = set(self) | set(other)
        return ResourceSlot({k: self.get(k, Decimal(0)) + Decimal(other.get(k, 0)) for k in keys})

    def __sub__(self, other: Mapping) -> ResourceSlot:
        keys = set(self) | set(other)
        return ResourceSlot({k: self.get(k, Decimal(0)) - Decimal(other.get(k, 0)) for k in keys})

    def fits_in(self, capacity: Mapping) -> bool:
        """True when every requested amount is within ``capacity`` (missing = 0)."""
        return all(v <= Decimal(capacity.get(k, 0)) for k, v in self.items() if v > 0)

    def is_nonnegative(self) -> bool:
        return all(v >= 0 for v in self.values())

    def nonzero(self) -> ResourceSlot:
        return ResourceSlot({k: v for k, v in self.items() if v != 0})

    def __repr__(self) -> str:
        return f"ResourceSlot({self.to_json()})"

    def describe(self) -> str:
        parts = []
        for k, v in sorted(self.items()):
            parts.append(f"{k}={format_size(v) if k == MEM else v}")
        return ", ".join(parts)
