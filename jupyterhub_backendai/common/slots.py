"""Resource slots: exact (Decimal) amounts of named resources.

Slot names follow Backend.AI: ``cpu`` (cores), ``mem`` (bytes), ``cuda.device``
(whole GPUs) and ``cuda.mig-<profile>`` (MIG instances of one NVML profile, such as
``cuda.mig-1g.10gb``; a count). :func:`is_known_slot` is the one definition of
what a slot name may be. Arithmetic is exact so that freeing exactly what was taken always
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
#: The fixed slot names; MIG slots (:data:`MIG_SLOT_RE`) come on top.
KNOWN_SLOTS = (CPU, MEM, CUDA)
MIG_PREFIX = "cuda.mig-"
#: An NVML MIG profile as ``nvidia-smi`` names it: ``1g.5gb``, ``1g.10gb``, ``3g.40gb``,
#: ``7g.80gb``, with media-engine or other suffixes (``1g.10gb+me``, ``1g.24gb+gfx``,
#: ``1g.10gb-me``) and compute-instance profiles (``1c.3g.40gb``).
_PROFILE = r"(?:[1-9][0-9]?c\.)?[1-9][0-9]?g\.[0-9]{1,4}gb(?:[+-][a-z]{1,8}(?:\.[a-z]{1,8})?){0,3}"
MIG_PROFILE_RE = re.compile(f"^{_PROFILE}$")
#: The pattern of a MIG slot name (also the API document's, so it stays ECMA-262 too).
MIG_SLOT_PATTERN = "^cuda\\.mig-" + _PROFILE + "$"
MIG_SLOT_RE = re.compile(MIG_SLOT_PATTERN)
#: Any slot name (the API document's ``propertyNames``).
SLOT_NAME_PATTERN = "^(?:cpu|mem|cuda\\.device|cuda\\.mig-" + _PROFILE + ")$"
#: What a slot name may be, said in words (errors and the API document).
MIG_PROFILE_WORDS = "an NVML MIG profile such as 1g.10gb, 3g.40gb or 1g.10gb+me"
SLOT_NAMES_WORDS = f"{CPU}, {MEM}, {CUDA} or {MIG_PREFIX}<profile> ({MIG_PROFILE_WORDS})"


def is_mig_slot(name) -> bool:
    """``cuda.mig-<profile>`` with a well-formed NVML MIG profile."""
    return isinstance(name, str) and MIG_SLOT_RE.fullmatch(name) is not None


def is_known_slot(name) -> bool:
    """A slot name the platform knows: cpu, mem, cuda.device or cuda.mig-<profile>."""
    return name in KNOWN_SLOTS or is_mig_slot(name)


def mig_slot(profile: str) -> str:
    return f"{MIG_PREFIX}{profile}"


def unknown_slot_words(name) -> str:
    """Why ``name`` is not a slot name, in plain words."""
    if isinstance(name, str) and name.startswith(MIG_PREFIX):
        return (f"{name!r} is not a MIG slot: the profile after {MIG_PREFIX!r} must be "
                f"{MIG_PROFILE_WORDS}")
    return f"unknown slot {name!r} (slots are {SLOT_NAMES_WORDS})"

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


def format_bytes(b) -> str:
    """A byte count for people: ``512 MiB``, ``1.5 GiB``, ``23 GiB`` (binary units,
    at most one decimal)."""
    b = Decimal(b)
    for unit, name in (("t", "TiB"), ("g", "GiB"), ("m", "MiB"), ("k", "KiB")):
        if b >= _UNITS[unit]:
            return f"{_one_decimal(b / _UNITS[unit])} {name}"
    return f"{b} byte" if b == 1 else f"{b} bytes"


def format_cores(c) -> str:
    """CPU cores for people: ``1 core``, ``2 cores``, ``0.5 cores``."""
    c = Decimal(c)
    text = _one_decimal(c, places=2)
    return f"{text} core" if text == "1" else f"{text} cores"


def format_slots(slots: Mapping) -> str:
    """Resource slots for people: ``2 cores, 23 GiB memory, 1 GPU``."""
    parts = []
    for k in (CPU, MEM, CUDA):
        if k not in slots:
            continue
        v = parse_size(slots[k]) if k == MEM else Decimal(slots[k])  # (an image's "256m")
        if k == CPU:
            parts.append(format_cores(v))
        elif k == MEM:
            parts.append(f"{format_bytes(v)} memory")
        elif k == CUDA:
            text = _one_decimal(v)
            parts.append(f"{text} GPU" + ("" if text == "1" else "s"))
    for k in sorted(set(slots) - {CPU, MEM, CUDA}):
        if is_mig_slot(k):
            text = _one_decimal(Decimal(slots[k]))
            parts.append(f"{text} MIG {k[len(MIG_PREFIX):]} instance" + ("" if text == "1" else "s"))
        else:
            parts.append(f"{slots[k]} {k}")
    return ", ".join(parts)


def _one_decimal(d: Decimal, places: int = 1) -> str:
    q = Decimal(1).scaleb(-places)
    text = format(d.quantize(q), "f") if d != d.to_integral_value() else format(d.to_integral_value(), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


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

    def human(self) -> str:
        """``2 cores, 23 GiB memory, 1 GPU`` (see format_slots)."""
        return format_slots(self)

    def describe(self) -> str:
        parts = []
        for k, v in sorted(self.items()):
            parts.append(f"{k}={format_size(v) if k == MEM else v}")
        return ", ".join(parts)
