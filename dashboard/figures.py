"""Plotly figures and display tables of the dashboard, as pure functions of DataFrames.

Inputs are the frames :mod:`inferpath.dashboard.client` returns (durations in seconds, UTC
timestamps). Display is in milliseconds and in the wall time of the chosen zone; both
conversions (seconds to milliseconds, instants to wall time: :func:`wall_time`) live here
and nowhere else. Missing data is never drawn as zero: an empty panel carries a "no data"
annotation, and a bucket without samples is a gap in its line (``NaN``), not a dip to 0.
Nothing here imports Streamlit, so every builder is testable on small frames.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MS_PER_SECOND = 1000.0
MS_PER_NS = 1e-6
NO_DATA = "no data"
BRUSH_LAYOUT = {"dragmode": "select", "selectdirection": "h"}
"""Layout of every time chart: dragging selects a span of time, which the page makes its
window (:mod:`inferpath.dashboard.brush`); zoom stays in the chart's toolbar."""

# Order of the per-stage table: what the user felt first, then the path from the edge inwards.
MEASURE_ORDER = [
    "client_ttft",
    "client_e2e",
    "ttft",
    "e2e",
    "itl",
    "gateway",
    "network",
    "tokenize",
    "retrieval",
    "queue",
    "prefill",
    "decode",
    "model",
    "postprocess",
]
MEASURE_LABELS = {
    "client_ttft": "TTFT (client)",
    "client_e2e": "E2E (client)",
    "ttft": "TTFT (server)",
    "e2e": "E2E (server)",
    "itl": "ITL",
    "gateway": "gateway (self time)",
    "network": "network",
    "tokenize": "tokenize",
    "retrieval": "retrieval",
    "queue": "queue",
    "prefill": "prefill",
    "decode": "decode",
    "model": "model call",
    "postprocess": "postprocess",
}
# A request row answers "where did its time go": the latency felt (the client's when it
# measured, else the gateway's), then the engine's three phases, then the rest. The first
# eight columns fit a 1600 px wide page beside the sidebar.
_REQUEST_LEADING = (("client_e2e", "e2e"), ("client_ttft", "ttft"), ("queue",), ("prefill",), ("decode",))
_REQUEST_DURATION_ORDER = [
    "client_e2e",
    "e2e",
    "client_ttft",
    "ttft",
    "queue",
    "prefill",
    "decode",
    "itl",
    "gateway",
    "network",
    "tokenize",
    "retrieval",
    "model",
    "postprocess",
]
_REQUEST_IDENTITY_ORDER = ["status", "endpoint", "endpoint_class", "model", "input_tokens", "output_tokens", "trace_id"]
STAGE_TABLE_COLUMNS = ["stage", "count", "avg_ms", "p50_ms", "p95_ms", "p99_ms"]

# Gauges get their own hues so an engine series is never mistaken for an endpoint class.
_GAUGE_COLORS = ["#2ca02c", "#17becf", "#7f7f7f", "#bcbd22", "#393b79", "#637939"]


def wall_time(values: pd.Series | Sequence[Any], tz: str) -> pd.Series:
    """Instants (aware in any zone, naive meaning UTC, ISO strings or unix seconds) as naive
    wall-clock times in ``tz``.

    Plotly draws a timestamp's wall time and ignores its offset, so converting to the
    chosen zone and then dropping the offset is what makes the axis read correctly. Every
    figure and table that shows a time converts it here, once. Raises ``zoneinfo``/pandas
    errors for an unknown zone name.
    """
    series = pd.Series(values)
    if series.empty:
        return pd.Series(pd.DatetimeIndex([]), index=series.index)
    if pd.api.types.is_numeric_dtype(series):
        stamps = pd.to_datetime(series, unit="s", utc=True)
    elif isinstance(series.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(series):
        stamps = pd.to_datetime(series, utc=True)
    else:
        stamps = pd.to_datetime(series, utc=True, format="ISO8601")
    return stamps.dt.tz_convert(tz).dt.tz_localize(None)


def line_mode(values: Sequence[float | None]) -> str:
    """Plotly ``mode`` of a line with gaps: ``lines``, or ``lines+markers`` when a value
    stands alone between gaps (a line draws nothing for it, and missing must not look like
    nothing happened). Markers cost plotly a style pass per point: on a 360-point series
    they doubled the time Chromium took to draw the Overview."""
    present = [value is not None and not _is_nan(value) for value in values]
    for index, here in enumerate(present):
        if here and not (index > 0 and present[index - 1]) and not (index + 1 < len(present) and present[index + 1]):
            return "lines+markers"
    return "lines"


def fixed_margins(*, top: int = 40, bottom: int = 40, left: int = 60, right: int = 20) -> dict:
    """A figure's ``layout.margin`` with ``autoexpand`` off: a legend or title outside the
    plot area must fit in these pixels. With autoexpand on, plotly draws a figure, finds
    that its legend pushes a margin, and draws it again: a third of Chromium's time on a
    page of subplots (``bench/dashboard_rerun.py --browser``)."""
    return {"l": left, "r": right, "t": top, "b": bottom, "autoexpand": False}


def gauge_over_time(
    gauge_df: pd.DataFrame, tz: str, *, title: str, y_title: str, scale: float = 1.0, step_seconds: float | None = None
) -> go.Figure:
    """One canonical gauge (KV-cache usage, running requests, ...) per series over time.

    ``gauge_df``: rows ``bucket`` (aware instants in any zone; UTC as the read API sends
    them), ``service_name``, ``attributes``, ``value``; drawn in the wall time of ``tz``,
    which the time axis names. ``scale`` multiplies values for display (e.g. 100 for a
    ratio shown in percent). Empty input gives a "no data" annotation.
    """
    from inferpath.dashboard.rows import StackedRows

    rows = StackedRows([title])
    gauge = _non_empty(gauge_df, ["value"])
    if gauge.empty:
        rows.note(1, NO_DATA, size=16)
    else:
        service = gauge["service_name"] if "service_name" in gauge else pd.Series(None, index=gauge.index)
        attributes = gauge["attributes"] if "attributes" in gauge else pd.Series(None, index=gauge.index)
        gauge["_series"] = [series_label(s, a) for s, a in zip(service, attributes)]
        for index, (label, series) in enumerate(gauge.groupby("_series", sort=True)):
            # Gaps are found on the instants (a DST change repeats wall times), then shown as wall time.
            series = _fill_gaps(series, step_seconds)
            # A gauge holds its value until the next sample: draw steps, not slopes.
            rows.trace(
                1,
                {
                    "type": "scatter",
                    "x": wall_time(series["bucket"], tz),
                    "y": series["value"] * scale,
                    "mode": "lines",
                    "name": label,
                    "line": {"shape": "hv", "color": _GAUGE_COLORS[index % len(_GAUGE_COLORS)]},
                    "connectgaps": False,
                    "hovertemplate": f"{label}: %{{y:.3g}} {y_title}<extra></extra>",
                },
            )
    rows.yaxis(1, title={"text": y_title}, rangemode="tozero")
    rows.xaxis(1, title={"text": f"time ({tz})"}, showticklabels=not gauge.empty)
    # The legend under the time axis: series labels (host, UUID, model) run long and wrap.
    return rows.figure(
        height=340,
        margin=fixed_margins(top=40, bottom=120),
        **BRUSH_LAYOUT,
        legend={"orientation": "h", "y": -0.35, "yanchor": "top"},
    )


def stage_latency_table(summary_df: pd.DataFrame) -> pd.DataFrame:
    """Per-stage latency table in milliseconds from the read API's ``/summary`` rows.

    Output columns :data:`STAGE_TABLE_COLUMNS`, one row per measure in
    :data:`MEASURE_ORDER` (unknown measures after them), labelled for people. Measures
    without samples keep ``NaN`` (shown blank), never 0.
    """
    if summary_df.empty or "measure" not in summary_df:
        return pd.DataFrame(columns=STAGE_TABLE_COLUMNS)
    rank = {measure: index for index, measure in enumerate(MEASURE_ORDER)}
    rows = summary_df.assign(_rank=summary_df["measure"].map(rank).fillna(len(rank)))
    rows = rows.sort_values(["_rank", "measure"], kind="stable")
    table = pd.DataFrame(
        {
            "stage": rows["measure"].map(lambda m: MEASURE_LABELS.get(m, m)),
            "count": pd.to_numeric(rows.get("count"), errors="coerce").fillna(0).astype("int64"),
        }
    )
    for stat in ("avg", "p50", "p95", "p99"):
        column = f"{stat}_seconds"
        seconds = (
            pd.to_numeric(rows[column], errors="coerce") if column in rows else pd.Series(np.nan, index=rows.index)
        )
        table[f"{stat}_ms"] = seconds * MS_PER_SECOND
    return table.reset_index(drop=True)


def requests_table(requests_df: pd.DataFrame, tz: str) -> pd.DataFrame:
    """Request rows for display: ``*_ns`` durations become ``*_ms`` columns, leading.

    ``timestamp`` becomes the wall time of ``tz`` (:func:`wall_time`). Order: ``timestamp``,
    E2E and TTFT (the client's when measured, else the server's), queue, prefill and decode,
    the other durations, then status, endpoint, class, model, tokens, ``trace_id`` and the
    rest. Duration columns
    that are null in every row (stages this deployment does not report) are left out;
    single nulls stay null, never 0.
    """
    table = requests_df.copy()
    if "timestamp" in table:
        table["timestamp"] = wall_time(table["timestamp"], tz)
    durations = []
    for column in list(table.columns):
        if column.endswith("_ns"):
            values = pd.to_numeric(table[column], errors="coerce") * MS_PER_NS
            table = table.drop(columns=column)
            if values.notna().any():
                table[column[:-3] + "_ms"] = values
                durations.append(column[:-3] + "_ms")
    rank = {f"{m}_ms": i for i, m in enumerate(_REQUEST_DURATION_ORDER)}
    durations.sort(key=lambda c: rank.get(c, len(rank)))
    first = [
        next(c for c in (f"{m}_ms" for m in names) if c in durations)
        for names in _REQUEST_LEADING
        if any(f"{m}_ms" in durations for m in names)
    ]
    leading = [c for c in ("timestamp",) if c in table] + first + [c for c in durations if c not in first]
    identity = [c for c in _REQUEST_IDENTITY_ORDER if c in table]
    rest = [c for c in table.columns if c not in leading and c not in identity]
    return table[leading + identity + rest].reset_index(drop=True)


def series_label(service_name: object, attributes: object) -> str:
    """Legend label of one gauge series: ``service`` plus its attributes, e.g. ``vllm engine=0``.

    inferpath's own bookkeeping attributes (``inferpath.*``, such as the source metric
    name) are left out: they do not tell series apart.
    """
    label = str(service_name) if service_name not in (None, "") and not _is_nan(service_name) else "unknown service"
    if isinstance(attributes, dict):
        shown = {k: v for k, v in attributes.items() if not str(k).startswith("inferpath.")}
        if shown:
            label += " " + " ".join(f"{key}={value}" for key, value in sorted(shown.items()))
    elif isinstance(attributes, str) and attributes not in ("", "{}"):
        label += f" {attributes}"
    return label


def _non_empty(frame: pd.DataFrame | None, value_columns: Iterable[str]) -> pd.DataFrame:
    # Rows whose every value column is null carry no data; a frame without a bucket column
    # cannot be placed on the time axis.
    if frame is None or frame.empty or "bucket" not in frame:
        return pd.DataFrame()
    present = [column for column in value_columns if column in frame]
    if not present:
        return pd.DataFrame()
    rows = frame.dropna(subset=present, how="all").dropna(subset=["bucket"])
    return rows.sort_values("bucket").copy()


def _fill_gaps(rows: pd.DataFrame, step_seconds: float | None) -> pd.DataFrame:
    # Insert NaN rows for buckets without samples so the line breaks instead of bridging.
    if not step_seconds or step_seconds <= 0 or len(rows) < 2:
        return rows
    step = pd.Timedelta(seconds=float(step_seconds))
    first, last = rows["bucket"].iloc[0], rows["bucket"].iloc[-1]
    if (last - first) / step > 10_000:  # a bad step must not explode the frame
        return rows
    grid = pd.date_range(first, last, freq=step)
    missing = grid.difference(pd.DatetimeIndex(rows["bucket"]))
    if missing.empty:
        return rows
    filler = pd.DataFrame({"bucket": missing})
    return pd.concat([rows, filler], ignore_index=True).sort_values("bucket")


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and np.isnan(value)
