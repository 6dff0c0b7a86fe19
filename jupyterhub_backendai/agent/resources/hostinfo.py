"""What a node has to offer: CPU cores and memory."""

from __future__ import annotations

import os
from decimal import Decimal


def cpu_count() -> Decimal:
    try:
        return Decimal(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return Decimal(os.cpu_count() or 1)


def total_memory() -> Decimal:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return Decimal(int(line.split()[1]) * 1024)
    raise RuntimeError("MemTotal not found in /proc/meminfo")
