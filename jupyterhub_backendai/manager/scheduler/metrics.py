"""Scheduler metrics on the default Prometheus registry (served at ``/hub/metrics``).

Labels are the resource group and, for rejections, one of the fixed reason codes
in :data:`.validators.REASONS`, never free text, so cardinality stays bounded.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

QUEUE_LENGTH = Gauge(
    "backendai_scheduler_queue_length",
    "PENDING sessions of the resource group after the last scheduler pass",
    ["resource_group"],
)
OLDEST_WAIT = Gauge(
    "backendai_scheduler_oldest_wait_seconds",
    "How long the oldest session still PENDING after the last pass has waited",
    ["resource_group"],
)
WAIT_SECONDS = Histogram(
    "backendai_scheduler_wait_seconds",
    "Time from a session's creation to its placement (SCHEDULED)",
    ["resource_group"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
)
PLACEMENTS = Counter(
    "backendai_scheduler_placements",
    "Sessions placed on agents (became SCHEDULED)",
    ["resource_group"],
)
REJECTIONS = Counter(
    "backendai_scheduler_rejections",
    "Sessions left PENDING or CANCELLED by a pass, once per pass, by reason",
    ["resource_group", "reason"],
)
PASS_SECONDS = Histogram(
    "backendai_scheduler_pass_seconds",
    "Duration of one scheduler pass over a resource group (one transaction)",
    ["resource_group"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
SKIPPED_PASSES = Counter(
    "backendai_scheduler_skipped_passes",
    "Scheduler passes skipped because nothing they depend on changed since the last",
    ["resource_group"],
)


def _samples(metric, **labels):
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                yield sample


def counter_value(metric, **labels) -> float:
    """A counter's total over the samples matching ``labels``."""
    return sum(s.value for s in _samples(metric, **labels))


def counter_by(metric, label: str, **labels) -> dict[str, int]:
    """A counter's totals by the values of ``label``, over the samples matching ``labels``."""
    out: dict[str, int] = {}
    for sample in _samples(metric, **labels):
        key = sample.labels[label]
        out[key] = out.get(key, 0) + int(sample.value)
    return out
