"""Figures of the Overview, Correlate and Breakdown pages, as pure functions of view rows.

Inputs are the JSON objects of ``/api/v1/views/latency|correlate|breakdown`` (durations in
seconds or ns as the names say, times as UTC). Times are drawn as wall-clock time in the
chosen zone (:func:`wall_time`); durations in milliseconds. Missing is never zero: a series
without any measured point gives its panel a "no data" annotation naming why, and a
``None`` inside a series is a gap.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from inferpath.dashboard.figures import MS_PER_NS, MS_PER_SECOND, NO_DATA, UNCLASSIFIED, wall_time

_STATS = [("p50", "solid"), ("p95", "dashdot"), ("p99", "dash"), ("avg", "dot")]
_COLORS = {"ttft": "#1f77b4", "itl": "#2ca02c", "e2e": "#9467bd"}

# Correlate rows: (column, panel title, axis label, scale, is a step-held gauge)
CORRELATE_PANELS: list[tuple[str, str, str, float, bool]] = [
    ("queue_depth", "Queue depth", "waiting", 1.0, True),
    ("running_requests", "Running requests", "running", 1.0, True),
    ("kv_cache_usage_ratio", "KV-cache usage", "%", 100.0, True),
    ("preemptions_per_second", "Preemptions", "per s", 1.0, False),
    ("gpu_utilization_ratio", "GPU utilization", "%", 100.0, True),
    ("gpu_memory_used_bytes", "GPU memory used", "GiB", 1.0 / 2**30, True),
]
SPIKE_FILL = "rgba(214, 39, 40, 0.15)"
STAGE_COLORS = {"gateway": "#8c564b", "tokenize": "#e377c2", "retrieval": "#bcbd22",
                "queue": "#d62728", "prefill": "#ff7f0e", "decode": "#1f77b4",
                "network": "#17becf", "rest": "#c7c7c7"}


def _no_data(figure: go.Figure, row: int, why: str = NO_DATA) -> None:
    axis = "" if row == 1 else str(row)
    figure.update_yaxes(showticklabels=False, row=row, col=1)
    figure.add_annotation(text=why, xref=f"x{axis} domain", yref=f"y{axis} domain", x=0.5,
                          y=0.5, showarrow=False, font={"size": 14, "color": "#888"})


def _values(points: Sequence[Mapping[str, Any]], column: str, scale: float) -> list[float | None]:
    return [None if p.get(column) is None else float(p[column]) * scale for p in points]


def latency_by_class(view: Mapping[str, Any], tz: str) -> dict[str, go.Figure]:
    """Overview figures, one per endpoint class, from ``/views/latency``.

    Rows on one time axis: TTFT, ITL and E2E (p50, p95, p99 and mean, ms); requests and
    errors per second; the p99-to-mean ratio of each measure (how heavy the tail is: 1 means
    every request is alike). Classes without a name are ``unclassified``.
    """
    step = float(view.get("step_seconds") or 1)
    by_class: dict[str, list[Mapping[str, Any]]] = {}
    for point in view.get("points", []):
        by_class.setdefault(point.get("endpoint_class") or UNCLASSIFIED, []).append(point)
    figures: dict[str, go.Figure] = {}
    for klass, points in sorted(by_class.items()):
        x = wall_time([p["bucket"] for p in points], tz)
        figure = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                               subplot_titles=("TTFT", "ITL", "E2E", "Requests and errors",
                                               "p99 / mean"))
        for row, measure in enumerate(("ttft", "itl", "e2e"), start=1):
            drawn = False
            for stat, dash in _STATS:
                y = _values(points, f"{measure}_{stat}_seconds", MS_PER_SECOND)
                if all(v is None for v in y):
                    continue
                drawn = True
                figure.add_trace(go.Scatter(
                    x=x, y=y, mode="lines", name=f"{measure.upper()} {stat}",
                    legendgroup=measure, line={"color": _COLORS[measure], "dash": dash},
                    connectgaps=False), row=row, col=1)
            if not drawn:
                _no_data(figure, row, f"no {measure.upper()} measured")
            figure.update_yaxes(title_text="ms", rangemode="tozero", row=row, col=1)
        figure.add_trace(go.Bar(x=x, y=[p["requests"] / step for p in points], name="requests/s",
                                marker_color="#7f7f7f"), row=4, col=1)
        figure.add_trace(go.Bar(x=x, y=[p["errors"] / step for p in points], name="errors/s",
                                marker_color="#d62728"), row=4, col=1)
        figure.update_yaxes(title_text="per s", rangemode="tozero", row=4, col=1)
        for measure in ("ttft", "itl", "e2e"):
            ratio = [None if (p.get(f"{measure}_p99_seconds") is None
                              or not p.get(f"{measure}_avg_seconds"))
                     else p[f"{measure}_p99_seconds"] / p[f"{measure}_avg_seconds"] for p in points]
            if any(v is not None for v in ratio):
                figure.add_trace(go.Scatter(x=x, y=ratio, mode="lines+markers",
                                            name=f"{measure.upper()} p99/mean",
                                            line={"color": _COLORS[measure]}, connectgaps=False),
                                 row=5, col=1)
        figure.update_yaxes(title_text="ratio", rangemode="tozero", row=5, col=1)
        figure.update_xaxes(title_text=f"time ({tz})", row=5, col=1)
        if len(x):  # the window's own span: a row with nothing drawn must not widen it to 1970-2030
            bounds = pd.Series(x)
            figure.update_xaxes(range=[bounds.iloc[0], bounds.iloc[-1] + pd.Timedelta(seconds=step)])
        figure.update_layout(height=1000, barmode="overlay", hovermode="x unified",
                             margin={"l": 60, "r": 20, "t": 40, "b": 40},
                             legend={"orientation": "h", "y": -0.06})
        figures[klass] = figure
    return figures


def correlate_figure(view: Mapping[str, Any], tz: str, *,
                     missing_reason: str = "not reported in this window") -> go.Figure:
    """The Correlate figure from ``/views/correlate``: TTFT p99 and mean (ms), then every
    panel of :data:`CORRELATE_PANELS`, on one shared time axis; each detected spike is a
    shaded band over all panels. A signal with no sample in the window shows
    ``missing_reason`` instead of a flat zero line.
    """
    points = view.get("points", [])
    titles = ["TTFT (server)"] + [title for _, title, *_ in CORRELATE_PANELS]
    figure = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.025,
                           subplot_titles=titles)
    x = wall_time([p["time"] for p in points], tz)
    drawn = False
    for column, name, dash in (("ttft_p99_seconds", "TTFT p99", "solid"),
                               ("ttft_avg_seconds", "TTFT mean", "dot")):
        y = _values(points, column, MS_PER_SECOND)
        if any(v is not None for v in y):
            drawn = True
            figure.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=name,
                                        line={"color": "#1f77b4", "dash": dash},
                                        marker={"size": 4}, connectgaps=False), row=1, col=1)
    if not drawn:
        _no_data(figure, 1, "no requests in this window")
    figure.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
    for row, (column, title, unit, scale, held) in enumerate(CORRELATE_PANELS, start=2):
        y = _values(points, column, scale)
        if all(v is None for v in y):
            _no_data(figure, row, f"{title}: {missing_reason}")
            continue
        figure.add_trace(go.Scatter(x=x, y=y, mode="lines", name=title,
                                    line={"shape": "hv" if held else "linear", "color": "#2ca02c"},
                                    connectgaps=False), row=row, col=1)
        figure.update_yaxes(title_text=unit, rangemode="tozero", row=row, col=1)
    for spike in view.get("spikes", []):
        start, end = wall_time([spike["start"], spike["end"]], tz)
        # One band over the whole height: every panel reads the same (matched) x axis.
        figure.add_shape(type="rect", xref="x", yref="paper", x0=start, x1=end, y0=0, y1=1,
                         fillcolor=SPIKE_FILL, line_width=0, layer="below")
    figure.update_xaxes(title_text=f"time ({tz})", row=len(titles), col=1)
    figure.update_layout(height=170 * len(titles), hovermode="x unified", showlegend=True,
                         margin={"l": 60, "r": 20, "t": 40, "b": 40},
                         legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    return figure


def spike_label(spike: Mapping[str, Any], tz: str) -> str:
    """A spike for a picker: ``12:19:51–12:19:56 · p99 7374 ms = 27× baseline``."""
    start, end = wall_time([spike["start"], spike["end"]], tz)
    return (f"{start:%H:%M:%S}–{end:%H:%M:%S} · p99 {spike['peak_seconds'] * MS_PER_SECOND:.0f} ms"
            f" = {spike['ratio']:.0f}× baseline")


def band_shares_figure(bands: Sequence[Mapping[str, Any]], *, measure: str) -> go.Figure:
    """Stacked horizontal bars: the share of ``measure`` each stage takes, per percentile
    band (rows of :func:`inferpath.analysis.breakdown.breakdown_by_band`), in percent.

    ``rest`` (time no span explains) can be negative when stages overlap; it is drawn as
    it is. An empty input gives a "no data" annotation.
    """
    figure = go.Figure()
    if not bands:
        figure.add_annotation(text=NO_DATA, x=0.5, y=0.5, xref="paper", yref="paper",
                              showarrow=False, font={"size": 14, "color": "#888"})
        figure.update_layout(height=240, xaxis={"visible": False}, yaxis={"visible": False})
        return figure
    labels = [f"{b['group']} ({b['count']} req, mean {b['total_mean_ns'] * MS_PER_NS:.0f} ms)"
              for b in bands]
    stages = list(dict.fromkeys(stage for b in bands for stage in b["stage_share"]))
    for stage in stages:
        figure.add_trace(go.Bar(
            y=labels, x=[b["stage_share"].get(stage, 0.0) * 100 for b in bands], name=stage,
            orientation="h", marker_color=STAGE_COLORS.get(stage, "#7f7f7f"),
            customdata=[b["stage_mean_ns"].get(stage, 0.0) * MS_PER_NS for b in bands],
            hovertemplate=f"{stage}: %{{x:.1f}}%% (%{{customdata:.1f}} ms)<extra></extra>"))
    figure.update_layout(barmode="relative", height=80 + 60 * len(bands),
                         title=f"Share of {measure.upper()} per stage, by percentile band",
                         xaxis_title="% of the band's total time", yaxis={"autorange": "reversed"},
                         margin={"l": 60, "r": 20, "t": 50, "b": 40},
                         legend={"orientation": "h", "y": -0.3})
    return figure


def hops_table(hops: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Gateway/network overhead per hop in ms: caller, callee, calls, mean, p50, p95, p99."""
    columns = ["caller", "callee", "calls", "avg_ms", "p50_ms", "p95_ms", "p99_ms"]
    rows = [{"caller": h["caller_service"], "callee": f"{h['callee_service']} ({h['callee_span']})",
             "calls": h["count"],
             **{f"{s}_ms": None if h.get(f"{s}_seconds") is None
                else h[f"{s}_seconds"] * MS_PER_SECOND for s in ("avg", "p50", "p95", "p99")}}
            for h in hops]
    return pd.DataFrame(rows, columns=columns)


__all__ = ["CORRELATE_PANELS", "band_shares_figure", "correlate_figure", "hops_table",
           "latency_by_class", "spike_label", "wall_time"]
