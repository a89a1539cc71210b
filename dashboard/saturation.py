"""Engine and GPU saturation beside TTFT, from ``/api/v1/views/signals``: pure figure builders.

Rules that keep these panels from misleading:

- **One colour per signal** (:data:`SIGNAL_COLORS`), the same on every page.
- **The max per step** is the line (a 1 s spike of the KV cache inside a 30 s step stays
  visible; the value "as of the step's end" zig-zagged between full and empty); the mean
  is a dotted second line.
- **Not exported is not 0**: a signal without samples says so in its panel.
- **Sums say what they add up**: "GPU memory used (sum of 4 GPUs)"; capacity is drawn as
  a dashed line where it is known (KV 100 %, the batch-slot limit, total GPU memory).
- **Stale is marked**: when a signal's last sample is older than :func:`stale_after_seconds`
  before the window's end, the rest of the panel is shaded and says since when.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from inferpath.dashboard.figures import (
    BRUSH_LAYOUT,
    MS_PER_SECOND,
    fixed_margins,
    line_mode,
    wall_time,
)
from inferpath.dashboard.rows import StackedRows
from inferpath.vocabulary import UNCLASSIFIED

SIGNAL_COLORS = {
    "ttft": "#1f77b4",
    "queue_depth": "#d62728",
    "running_requests": "#ff7f0e",
    "batch_size": "#bcbd22",
    "kv_cache_usage_ratio": "#9467bd",
    "preemptions_per_second": "#17becf",
    "gpu_utilization_ratio": "#2ca02c",
    "gpu_memory_used_bytes": "#8c564b",
    "gpu_power_watts": "#e377c2",
}
CLASS_COLORS = {"interactive": "#1f77b4", "bulk": "#ff7f0e", UNCLASSIFIED: "#7f7f7f"}
# signal → (title, unit, display scale, what its series are)
SIGNAL_PANELS: dict[str, tuple[str, str, float, str]] = {
    "queue_depth": ("Queue depth", "waiting", 1.0, "engine"),
    "running_requests": ("Running batch", "running", 1.0, "engine"),
    "kv_cache_usage_ratio": ("KV-cache usage", "%", 100.0, "engine"),
    "batch_size": ("Batch size", "requests", 1.0, "engine"),
    "gpu_utilization_ratio": ("GPU utilization", "%", 100.0, "GPU"),
    "gpu_memory_used_bytes": ("GPU memory used", "GiB", 1.0 / 2**30, "GPU"),
    "gpu_power_watts": ("GPU power", "W", 1.0, "GPU"),
}
STALE_FILL = "rgba(120, 120, 120, 0.15)"
SPIKE_FILL = "rgba(214, 39, 40, 0.15)"
NOT_EXPORTED = "not exported: no source sent it in this window"


def stale_after_seconds(step_seconds: float) -> float:
    """A signal whose last sample is older than this before the window's end is stale:
    three steps, and at least 30 s (scrapes come every 1-15 s)."""
    return max(3 * float(step_seconds), 30.0)


def panel_title(signal: str, body: Mapping[str, Any] | None) -> str:
    """``GPU memory used (sum of 4 GPUs)``, ``KV-cache usage (fullest of 2 engines)``: the
    title says how several series were combined, and how many there were."""
    title, _, _, kind = SIGNAL_PANELS[signal]
    count = int((body or {}).get("series") or 0)
    if count <= 1:
        return title
    how = {"max": "fullest", "mean": "mean"}.get(str((body or {}).get("combine")), "sum")
    return f"{title} ({how} of {count} {kind}s)"


def add_signal_panel(
    rows: StackedRows,
    signal: str,
    body: Mapping[str, Any] | None,
    *,
    row: int,
    tz: str,
    window_end: datetime,
    step_seconds: float,
    capacity: float | None = None,
    capacity_label: str = "",
    show_mean: bool = True,
) -> None:
    """Draw ``signal`` (its ``/views/signals`` entry ``body``) into ``row`` of ``rows``:
    the max per step, the mean dotted, capacity dashed, "not exported" or stale marked."""
    title, unit, scale, _ = SIGNAL_PANELS[signal]
    rows.yaxis(row, title={"text": unit}, rangemode="tozero")
    points = (body or {}).get("points") or []
    if not points:
        rows.note(row, f"{title}: {NOT_EXPORTED}")
        return
    points = _with_gaps(points, step_seconds)
    x = wall_time([p["time"] for p in points], tz)
    color = SIGNAL_COLORS[signal]
    rows.trace(
        row,
        {
            "type": "scatter",
            "x": x,
            "y": [None if p["max"] is None else p["max"] * scale for p in points],
            "mode": "lines",
            "name": f"{title} (max per step)",
            "legendgroup": signal,
            "line": {"color": color, "shape": "hv"},
            "connectgaps": False,
        },
    )
    if show_mean:
        rows.trace(
            row,
            {
                "type": "scatter",
                "x": x,
                "y": [None if p["mean"] is None else p["mean"] * scale for p in points],
                "mode": "lines",
                "name": f"{title} (mean)",
                "legendgroup": signal,
                "showlegend": False,
                "connectgaps": False,
                "line": {"color": color, "shape": "hv", "dash": "dot", "width": 1},
            },
        )
    if capacity is not None:
        rows.hline(
            row,
            capacity * scale,
            line={"color": color, "dash": "dash", "width": 1},
            label=capacity_label,
            label_font={"size": 10, "color": color},
        )
    last_time = (body or {}).get("last_time")
    last = pd.Timestamp(last_time) if last_time else None
    end = pd.Timestamp(window_end)
    if last is not None and (end - last).total_seconds() > stale_after_seconds(step_seconds):
        last_wall, end_wall = wall_time([last, end], tz)
        rows.vrect(row, last_wall, end_wall, fillcolor=STALE_FILL)
        rows.label(row, f"stale: no sample since {last_wall:%H:%M:%S}", x=last_wall)


def _with_gaps(points: Sequence[Mapping[str, Any]], step_seconds: float) -> list[dict]:
    # A step without a sample is a gap in the line, never a held value (a dead engine must
    # not look idle, nor look busy).
    out: list[dict] = []
    step = pd.Timedelta(seconds=float(step_seconds))
    previous = None
    for point in points:
        at = pd.Timestamp(point["time"])
        if previous is not None and at - previous > step:
            out.append({"time": previous + step, "max": None, "mean": None})
        out.append(dict(point))
        previous = at
    return out


def add_objective_lines(rows: StackedRows, limits_ms: Mapping[str, float], *, row: int) -> None:
    """A dashed horizontal line per class at its TTFT p99 objective, labelled."""
    for klass, limit in sorted(limits_ms.items()):
        color = CLASS_COLORS.get(klass, "#7f7f7f")
        rows.hline(
            row,
            limit,
            line={"color": color, "dash": "dash", "width": 1.5},
            label=f"{klass} objective {limit:,.0f} ms",
            label_font={"size": 11, "color": color},
        )


def add_spike_bands(rows: StackedRows, spikes: Sequence[Mapping[str, Any]], tz: str) -> None:
    """One shaded band per spike over the whole height (every row shares the x axis)."""
    for spike in spikes:
        start, end = wall_time([spike["start"], spike["end"]], tz)
        rows.band(start, end, fillcolor=SPIKE_FILL)


_CROSSHAIR = {"showspikes": True, "spikemode": "across", "spikethickness": 1, "spikedash": "dot", "spikecolor": "#555"}
"""A crosshair through every row at the hovered time."""


def overview_figure(
    latency: Mapping[str, Any],
    signals: Mapping[str, Any],
    tz: str,
    *,
    ttft_limits_ms: Mapping[str, float],
    slot_limit: float | None,
    window_end: datetime,
    spikes: Sequence[Mapping[str, Any]] = (),
) -> go.Figure:
    """The Overview's one-screen figure: TTFT p99 per endpoint class with its objective
    drawn as a line, over queue depth, KV-cache usage, the running batch (its slot limit
    dashed when known) and GPU utilization when exported, on one time axis."""
    bodies = signals.get("signals", {})
    signal_rows = ["queue_depth", "kv_cache_usage_ratio", "running_requests"]
    if bodies.get("gpu_utilization_ratio"):
        signal_rows.append("gpu_utilization_ratio")
    titles = ["TTFT p99 by endpoint class"] + [panel_title(s, bodies.get(s)) for s in signal_rows]
    rows = StackedRows(titles, vertical_spacing=0.05, row_heights=[0.34] + [0.66 / len(signal_rows)] * len(signal_rows))
    by_class: dict[str, list[Mapping[str, Any]]] = {}
    for point in latency.get("points", []):
        by_class.setdefault(point.get("endpoint_class") or UNCLASSIFIED, []).append(point)
    for klass, points in sorted(by_class.items()):
        y = [None if p.get("ttft_p99_seconds") is None else p["ttft_p99_seconds"] * MS_PER_SECOND for p in points]
        rows.trace(
            1,
            {
                "type": "scatter",
                "x": wall_time([p["bucket"] for p in points], tz),
                "y": y,
                "mode": line_mode(y),
                "name": f"{klass} TTFT p99",
                "line": {"color": CLASS_COLORS.get(klass, "#7f7f7f")},
                "marker": {"size": 4},
                "connectgaps": False,
            },
        )
    rows.yaxis(1, title={"text": "ms"}, rangemode="tozero")
    if not by_class:
        rows.note(1, "no requests in this window")
    add_objective_lines(
        rows,
        {k: v for k, v in ttft_limits_ms.items() if k in by_class or not by_class or len(ttft_limits_ms) == 1},
        row=1,
    )
    step = float(signals.get("step_seconds") or latency.get("step_seconds") or 1)
    for row, signal in enumerate(signal_rows, start=2):
        capacity, label = None, ""
        if signal == "kv_cache_usage_ratio":
            capacity, label = 1.0, "full"
        elif signal == "running_requests" and slot_limit:
            capacity, label = slot_limit, f"batch limit {slot_limit:.0f}"
        elif signal == "gpu_utilization_ratio":
            capacity, label = 1.0, "100 %"
        add_signal_panel(
            rows,
            signal,
            bodies.get(signal),
            row=row,
            tz=tz,
            window_end=window_end,
            step_seconds=step,
            capacity=capacity,
            capacity_label=label,
        )
    add_spike_bands(rows, spikes, tz)
    rows.xaxes(**_CROSSHAIR)
    rows.xaxis(rows.rows, title={"text": f"time ({tz})"})
    return rows.figure(
        height=300 + 130 * len(signal_rows),
        hovermode="x unified",
        **BRUSH_LAYOUT,
        margin=fixed_margins(top=80, bottom=50),
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
    )


def gpu_memory_capacity(signals: Mapping[str, Any]) -> float | None:
    """Total GPU memory (bytes, summed over GPUs) as last reported in the window."""
    body = signals.get("signals", {}).get("gpu_memory_total_bytes") or {}
    values = [p["max"] for p in body.get("points", []) if p.get("max") is not None]
    return values[-1] if values else None


CORRELATE_SIGNALS = [
    "queue_depth",
    "running_requests",
    "kv_cache_usage_ratio",
    "preemptions_per_second",
    "gpu_utilization_ratio",
    "gpu_memory_used_bytes",
]
"""Rows of the Correlate figure under TTFT, in order."""


def correlate_figure(
    correlate: Mapping[str, Any],
    signals: Mapping[str, Any],
    tz: str,
    *,
    spikes: Sequence[Mapping[str, Any]],
    window_end: datetime,
    ttft_limits_ms: Mapping[str, float] | None = None,
) -> go.Figure:
    """The Correlate figure: TTFT p99 and mean per step (``/views/correlate``, requests by
    the step they started in) with the objective line, then each signal of
    :data:`CORRELATE_SIGNALS` from ``/views/signals`` (max per step, mean dotted, capacity
    dashed, "not exported" and stale marked; preemptions per second from the correlate
    view), on one shared time axis with each spike shaded over every row."""
    bodies = signals.get("signals", {})
    titles = ["TTFT"] + [
        "Preemptions per second" if s == "preemptions_per_second" else panel_title(s, bodies.get(s))
        for s in CORRELATE_SIGNALS
    ]
    rows = StackedRows(titles, vertical_spacing=0.03)
    points = correlate.get("points", [])
    x = wall_time([p["time"] for p in points], tz)
    drawn = False
    for column, name, dash in (("ttft_p99_seconds", "TTFT p99", "solid"), ("ttft_avg_seconds", "TTFT mean", "dot")):
        y = [None if p.get(column) is None else p[column] * MS_PER_SECOND for p in points]
        if any(v is not None for v in y):
            drawn = True
            rows.trace(
                1,
                {
                    "type": "scatter",
                    "x": x,
                    "y": y,
                    "mode": line_mode(y),
                    "name": name,
                    "line": {"color": SIGNAL_COLORS["ttft"], "dash": dash},
                    "marker": {"size": 4},
                    "connectgaps": False,
                },
            )
    rows.yaxis(1, title={"text": "ms"}, rangemode="tozero")
    if not drawn:
        rows.note(1, "no requests in this window")
    elif ttft_limits_ms:
        add_objective_lines(rows, ttft_limits_ms, row=1)
    step = float(signals.get("step_seconds") or correlate.get("step_seconds") or 1)
    for row, signal in enumerate(CORRELATE_SIGNALS, start=2):
        if signal == "preemptions_per_second":
            _preemption_panel(rows, points, x, row=row)
            continue
        capacity, label = None, ""
        if signal == "kv_cache_usage_ratio":
            capacity, label = 1.0, "full"
        elif signal == "gpu_utilization_ratio":
            capacity, label = 1.0, "100 %"
        elif signal == "gpu_memory_used_bytes":
            capacity = gpu_memory_capacity(signals)
            label = "total" if capacity is not None else ""
        add_signal_panel(
            rows,
            signal,
            bodies.get(signal),
            row=row,
            tz=tz,
            window_end=window_end,
            step_seconds=step,
            capacity=capacity,
            capacity_label=label,
        )
    add_spike_bands(rows, spikes, tz)
    rows.xaxes(**_CROSSHAIR)
    rows.xaxis(rows.rows, title={"text": f"time ({tz})"})
    return rows.figure(
        height=60 + 170 * len(titles),
        hovermode="x unified",
        **BRUSH_LAYOUT,
        margin=fixed_margins(top=100, bottom=50),
        legend={"orientation": "h", "y": 1.015, "yanchor": "bottom"},
    )


def _preemption_panel(rows: StackedRows, points: Sequence[Mapping[str, Any]], x: pd.Series, *, row: int) -> None:
    y = [p.get("preemptions_per_second") for p in points]
    rows.yaxis(row, title={"text": "per s"}, rangemode="tozero")
    if all(v is None for v in y):
        rows.note(row, f"Preemptions: {NOT_EXPORTED}")
        return
    rows.trace(
        row,
        {
            "type": "scatter",
            "x": x,
            "y": y,
            "mode": "lines",
            "name": "Preemptions per second",
            "line": {"color": SIGNAL_COLORS["preemptions_per_second"]},
            "connectgaps": False,
        },
    )


def spike_label(spike: Mapping[str, Any], tz: str) -> str:
    """A spike for a picker: ``12:19:51–12:19:56 · p99 7374 ms = 7.4× the threshold``."""
    start, end = wall_time([spike["start"], spike["end"]], tz)
    return (
        f"{start:%H:%M:%S}–{end:%H:%M:%S} · p99 {spike['peak_seconds'] * MS_PER_SECOND:.0f} ms"
        f" = {spike['ratio']:.1f}× the threshold"
    )
