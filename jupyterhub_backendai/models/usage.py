"""Sampled use of a kernel, per hour (issue 29 point 7: usage accounting that lasts).

The allocation side of usage (slots x running time) is computed from the sessions'
record (manager/usage.py); what a kernel actually used is sampled from its agent's live
statistics (agent/stats.py) and kept here, summed per kernel and UTC hour, so a report
for any period reads a few rows per kernel and survives restarts.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import BigInteger, Float, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UTCDateTime


class KernelUsage(Base):
    __tablename__ = "kernel_usage"

    kernel_id: Mapped[str] = mapped_column(
        ForeignKey("kernels.id", ondelete="CASCADE"), primary_key=True)
    hour: Mapped[dt.datetime] = mapped_column(UTCDateTime, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(32), index=True)
    # Over the sampled seconds of this hour: core-seconds used, memory byte-seconds in
    # use, GPU-seconds busy (utilisation x GPUs held), and the largest memory seen.
    sampled_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    cpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    mem_byte_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    mem_peak_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
