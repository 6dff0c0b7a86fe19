"""Use over time for the console's plots: a small time series kept by the hub.

Every ``c.UsageSeries.interval`` seconds the hub process reads the record once (the
manager's ``read_sample``, manager/pageviews.py: the agents' occupied and available
slots, the slots of placed sessions per project, the queue per resource group and the
waits of sessions placed since the last sample) and keeps the last
``c.UsageSeries.points`` samples in memory (a ring buffer: the history starts again
with each hub start and is not shared between hubs). The console draws them as inline
SVG (:func:`line_chart`): no script, nothing fetched.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import deque

from markupsafe import Markup, escape
from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable


class UsageSeries(LoggingConfigurable):
    """The hub's ring buffer of use samples (see the module's text)."""

    interval = Float(
        30.0, help="Seconds between two samples of use for the console's plots."
    ).tag(config=True)
    points = Integer(
        240, help="Samples kept (the plots span interval x points seconds; 2 h by default)."
    ).tag(config=True)

    def __init__(self, **kw):
        super().__init__(**kw)
        self.samples: deque = deque(maxlen=max(2, self.points))
        self._task: asyncio.Task | None = None
        self._last: dt.datetime | None = None

    def start(self, manager) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run(manager))

    async def _run(self, manager) -> None:
        await manager.ready()
        while True:
            try:
                await self.sample(manager)
            except Exception:  # a bad read must not end the series
                self.log.exception("use sample failed")
            await asyncio.sleep(self.interval)

    async def sample(self, manager) -> dict:
        now = dt.datetime.now(dt.UTC)
        since = self._last
        self._last = now
        s = await manager.ops.read_sample(now, since, self.interval * self.points)
        s["t"] = time.time()
        self.samples.append(s)
        return s


_series: UsageSeries | None = None


def series(config=None) -> UsageSeries:
    """The hub's one series (made with the manager's config the first time)."""
    global _series
    if _series is None:
        _series = UsageSeries(config=config)
    return _series


def start(manager) -> UsageSeries:
    s = series(manager.config)
    s.start(manager)
    return s


# -- what a principal may see, as charts ---------------------------------------------


def charts(samples, agents: set[str], projects: set[str], groups: set[str] | None) -> list[dict]:
    """Series per chart, limited to the agents, projects (ids) and resource groups
    (None: all) the caller may see in the console."""
    def collect(key, ids, field, label=lambda k, v: k, zero=True):
        # Projects and groups with nothing in use or waiting are not in a sample: 0 then
        # (``zero``), so that a line drops to 0 instead of bridging the gap.
        names = {k: label(k, v) for s in samples for k, v in s[key].items() if k in ids}
        out: dict[str, list] = {}
        for s in samples:
            for k, name in names.items():
                v = s[key].get(k)
                if v is not None and v.get(field) is not None:
                    out.setdefault(name, []).append((s["t"], v[field]))
                elif v is None and zero:
                    out.setdefault(name, []).append((s["t"], 0.0))
        return out

    qs = {k for s in samples for k in s["queues"] if groups is None or k in groups}
    out = [
        {"id": "agent-cpu", "title": "CPU cores in use per agent", "unit": "cores",
         "series": collect("agents", agents, "cpu")},
        {"id": "agent-mem", "title": "Memory in use per agent", "unit": "GiB",
         "series": collect("agents", agents, "mem")},
        {"id": "project-cpu", "title": "CPU cores in use per project", "unit": "cores",
         "series": collect("projects", projects, "cpu", lambda k, v: v["name"])},
        {"id": "project-mem", "title": "Memory in use per project", "unit": "GiB",
         "series": collect("projects", projects, "mem", lambda k, v: v["name"])},
        {"id": "queue-length", "title": "Sessions waiting per resource group", "unit": "sessions",
         "series": collect("queues", qs, "pending")},
        {"id": "queue-wait", "title": "Longest wait in the queue per resource group",
         "unit": "s", "series": collect("queues", qs, "oldest")},
        {"id": "placed-wait", "title": "Mean wait of the sessions placed per resource group",
         "unit": "s", "series": collect("queues", qs, "mean_wait", zero=False)},
    ]
    if any(v.get("gpu_total") for s in samples for v in s["agents"].values()):
        out.insert(2, {"id": "agent-gpu", "title": "GPUs in use per agent", "unit": "GPUs",
                       "series": collect("agents", agents, "gpu")})
    return out


# -- inline SVG ----------------------------------------------------------------------

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#17becf")
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 180, 48, 12, 10, 24


def _num(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.2f}".rstrip("0").rstrip(".")


def line_chart(chart: dict) -> Markup:
    """One chart as an ``<svg>`` with a legend: a line per series, a dot with a tooltip
    per sample, the y axis from 0 to the largest value, the x axis in clock time."""
    series = chart["series"]
    cid = escape(chart["id"])
    points = [p for pts in series.values() for p in pts]
    n = len(points)
    head = (f'<figure class="backendai-plot mb-4" id="plot-{cid}" data-points="{n}">'
            f'<figcaption class="h6" id="plot-{cid}-title">{escape(chart["title"])} '
            f'({escape(chart["unit"])})</figcaption>')
    if not points:
        return Markup(head + '<p class="small text-body-secondary">Nothing to draw: none in the samples kept '
                      'so far.</p></figure>')
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    top = max(p[1] for p in points) or 1.0
    span = max(t1 - t0, 1e-9)

    def x(t):
        return PAD_L + (W - PAD_L - PAD_R) * ((t - t0) / span if t1 > t0 else 0.5)

    def y(v):
        return PAD_T + (H - PAD_T - PAD_B) * (1 - v / top)

    clock = lambda t: time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" '
             f'role="img" aria-labelledby="plot-{cid}-title" style="max-width:{W}px">',
             f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" '
             f'stroke="currentColor" stroke-opacity="0.4"/>',
             f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" '
             f'stroke="currentColor" stroke-opacity="0.4"/>',
             f'<text x="{PAD_L - 4}" y="{PAD_T + 8}" text-anchor="end" font-size="10" '
             f'fill="currentColor">{_num(top)}</text>',
             f'<text x="{PAD_L - 4}" y="{H - PAD_B}" text-anchor="end" font-size="10" '
             f'fill="currentColor">0</text>',
             f'<text x="{PAD_L}" y="{H - 6}" font-size="10" fill="currentColor">{clock(t0)}</text>',
             f'<text x="{W - PAD_R}" y="{H - 6}" text-anchor="end" font-size="10" '
             f'fill="currentColor">{clock(t1)}</text>']
    legend = []
    for i, (label, pts) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        lab = escape(label)
        coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        parts.append(f'<g class="backendai-series" data-label="{lab}">'
                     f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        for t, v in pts:
            parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.5" fill="{color}">'
                         f'<title>{lab}: {_num(v)} {escape(chart["unit"])} at {clock(t)}</title>'
                         f'</circle>')
        parts.append("</g>")
        last = pts[-1][1]
        legend.append(f'<li class="list-inline-item"><span aria-hidden="true" '
                      f'style="color:{color}">&#9632;</span> '
                      f'{lab}: {_num(last)} {escape(chart["unit"])} now</li>')
    parts.append("</svg>")
    return Markup(head + "".join(parts) + '<ul class="list-inline small mb-0">'
                  + "".join(legend)
                  + "</ul></figure>")
