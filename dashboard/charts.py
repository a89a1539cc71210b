"""Figures of the Overview, Correlate and Breakdown pages, as pure functions of view rows.

Inputs are the JSON objects of ``/api/v1/views/latency|correlate|breakdown`` (durations in
seconds or ns as the names say, times as UTC). Times are drawn as wall-clock time in the
chosen zone (:func:`wall_time`); durations in milliseconds. Missing is never zero: a series
without any measured point gives its panel a "no data" annotation naming why, and a
``None`` inside a series is a gap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from inferpath.dashboard.figures import (
    BRUSH_LAYOUT,
    MS_PER_NS,
    MS_PER_SECOND,
    NO_DATA,
    fixed_margins,
    line_mode,
    wall_time,
)
from inferpath.dashboard.rows import StackedRows
from inferpath.vocabulary import UNCLASSIFIED

_STATS = [("p50", "solid"), ("p95", "dashdot"), ("p99", "dash"), ("avg", "dot")]
_COLORS = {"ttft": "#1f77b4", "itl": "#2ca02c", "e2e": "#9467bd"}

STAGE_COLORS = {
    "gateway": "#8c564b",
    "tokenize": "#e377c2",
    "retrieval": "#bcbd22",
    "queue": "#d62728",
    "prefill": "#ff7f0e",
    "decode": "#1f77b4",
    "network": "#17becf",
    "rest": "#c7c7c7",
}


def _values(points: Sequence[Mapping[str, Any]], column: str, scale: float) -> list[float | None]:
    return [None if p.get(column) is None else float(p[column]) * scale for p in points]


def _with_gaps(points: Sequence[Mapping[str, Any]], step: float) -> list[Mapping[str, Any]]:
    """``points`` (one per bucket with requests, in time order) with an empty bucket put in
    after each one followed by a gap, and before the next one: the latency lines break
    there instead of drawing across minutes without a request, and the rates drop to 0."""
    if len(points) < 2:
        return list(points)
    stamps = pd.to_datetime(pd.Series([p["bucket"] for p in points]), utc=True)
    width = pd.Timedelta(seconds=step)
    out: list[Mapping[str, Any]] = [points[0]]
    for k in range(1, len(points)):
        if stamps.iloc[k] - stamps.iloc[k - 1] > width:
            empties = {stamps.iloc[k - 1] + width, stamps.iloc[k] - width}
            out.extend({"bucket": at.isoformat(), "requests": 0, "errors": 0} for at in sorted(empties))
        out.append(points[k])
    return out


def latency_by_class(view: Mapping[str, Any], tz: str) -> dict[str, go.Figure]:
    """Overview figures, one per endpoint class, from ``/views/latency``.

    Rows on one time axis: TTFT, ITL and E2E (p50, p95, p99 and mean, ms); requests and
    errors per second; the p99-to-mean ratio of each measure (how heavy the tail is: 1 means
    every request is alike). Classes without a name are ``unclassified``. Lines break where
    buckets have no request.
    """
    step = float(view.get("step_seconds") or 1)
    by_class: dict[str, list[Mapping[str, Any]]] = {}
    for point in view.get("points", []):
        by_class.setdefault(point.get("endpoint_class") or UNCLASSIFIED, []).append(point)
    figures: dict[str, go.Figure] = {}
    for klass, points in sorted(by_class.items()):
        points = _with_gaps(points, step)
        x = wall_time([p["bucket"] for p in points], tz)
        rows = StackedRows(("TTFT", "ITL", "E2E", "Requests and errors", "p99 / mean"))
        for row, measure in enumerate(("ttft", "itl", "e2e"), start=1):
            drawn = False
            for stat, dash in _STATS:
                y = _values(points, f"{measure}_{stat}_seconds", MS_PER_SECOND)
                if all(v is None for v in y):
                    continue
                drawn = True
                rows.trace(
                    row,
                    {
                        "type": "scatter",
                        "x": x,
                        "y": y,
                        "mode": line_mode(y),
                        "name": f"{measure.upper()} {stat}",
                        "line": {"color": _COLORS[measure], "dash": dash},
                        "connectgaps": False,
                    },
                )
            rows.yaxis(row, title={"text": "ms"}, rangemode="tozero")
            if not drawn:
                rows.note(row, f"no {measure.upper()} measured", size=14)
        # Rates as step lines: one path per series (a bar is an SVG path per bucket, 720
        # of them per figure at 360 buckets).
        for name, key, color in (("requests/s", "requests", "#7f7f7f"), ("errors/s", "errors", "#d62728")):
            rows.trace(
                4,
                {
                    "type": "scatter",
                    "x": x,
                    "y": [p[key] / step for p in points],
                    "mode": "lines",
                    "name": name,
                    "line": {"color": color, "shape": "hv"},
                },
            )
        rows.yaxis(4, title={"text": "per s"}, rangemode="tozero")
        for measure in ("ttft", "itl", "e2e"):
            ratio = [
                None
                if (p.get(f"{measure}_p99_seconds") is None or not p.get(f"{measure}_avg_seconds"))
                else p[f"{measure}_p99_seconds"] / p[f"{measure}_avg_seconds"]
                for p in points
            ]
            if any(v is not None for v in ratio):
                rows.trace(
                    5,
                    {
                        "type": "scatter",
                        "x": x,
                        "y": ratio,
                        "mode": line_mode(ratio),
                        "name": f"{measure.upper()} p99/mean",
                        "line": {"color": _COLORS[measure]},
                        "connectgaps": False,
                    },
                )
        rows.yaxis(5, title={"text": "ratio"}, rangemode="tozero")
        rows.xaxis(5, title={"text": f"time ({tz})"})
        if len(x):  # the window's own span: a row with nothing drawn must not widen it to 1970-2030
            bounds = pd.Series(x)
            rows.xaxes(range=[bounds.iloc[0], bounds.iloc[-1] + pd.Timedelta(seconds=step)])
        # The legend above the first row: 17 entries flow in two lines (grouped by measure,
        # plotly would stack each group in a column of its own, four lines high).
        figures[klass] = rows.figure(
            height=1060,
            hovermode="x unified",
            **BRUSH_LAYOUT,
            margin=fixed_margins(top=100, bottom=50),
            legend={"orientation": "h", "y": 1.035, "yanchor": "bottom"},
        )
    return figures


def band_shares_figure(bands: Sequence[Mapping[str, Any]], *, measure: str) -> go.Figure:
    """Stacked horizontal bars: the share of ``measure`` each stage takes, per percentile
    band (rows of :func:`inferpath.analysis.breakdown.breakdown_by_band`), in percent.

    ``rest`` (time no span explains) can be negative when stages overlap; it is drawn as
    it is. An empty input gives a "no data" annotation.
    """
    figure = go.Figure()
    if not bands:
        figure.add_annotation(
            text=NO_DATA, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font={"size": 14, "color": "#888"}
        )
        figure.update_layout(height=240, xaxis={"visible": False}, yaxis={"visible": False})
        return figure
    labels = [f"{b['group']} ({b['count']} req, mean {b['total_mean_ns'] * MS_PER_NS:.0f} ms)" for b in bands]
    stages = list(dict.fromkeys(stage for b in bands for stage in b["stage_share"]))
    for stage in stages:
        figure.add_trace(
            go.Bar(
                y=labels,
                x=[b["stage_share"].get(stage, 0.0) * 100 for b in bands],
                name=stage,
                orientation="h",
                marker_color=STAGE_COLORS.get(stage, "#7f7f7f"),
                customdata=[b["stage_mean_ns"].get(stage, 0.0) * MS_PER_NS for b in bands],
                hovertemplate=f"{stage}: %{{x:.1f}}%% (%{{customdata:.1f}} ms)<extra></extra>",
            )
        )
    figure.update_layout(
        barmode="relative",
        height=150 + 60 * len(bands),
        title=f"Share of {measure.upper()} per stage, by percentile band",
        xaxis_title="% of the band's total time",
        yaxis={"autorange": "reversed"},
        margin=fixed_margins(top=50, bottom=110, left=240),
        legend={"orientation": "h", "y": -0.45, "yanchor": "top"},
    )
    return figure


def hops_table(hops: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Gateway/network overhead per hop in ms: caller, callee, calls, mean, p50, p95, p99."""
    columns = ["caller", "callee", "calls", "avg_ms", "p50_ms", "p95_ms", "p99_ms"]
    rows = [
        {
            "caller": h["caller_service"],
            "callee": f"{h['callee_service']} ({h['callee_span']})",
            "calls": h["count"],
            **{
                f"{s}_ms": None if h.get(f"{s}_seconds") is None else h[f"{s}_seconds"] * MS_PER_SECOND
                for s in ("avg", "p50", "p95", "p99")
            },
        }
        for h in hops
    ]
    return pd.DataFrame(rows, columns=columns)


__all__ = ["band_shares_figure", "hops_table", "latency_by_class", "wall_time"]
