"""Plotly figures and display tables of the dashboard, as pure functions of DataFrames.

Inputs are the frames :mod:`inferpath.dashboard.client` returns (durations in seconds, UTC
timestamps). Display is in milliseconds; the seconds-to-milliseconds conversion lives here
and nowhere else. Missing data is never drawn as zero: an empty panel carries a "no data"
annotation, and a bucket without samples is a gap in its line (``NaN``), not a dip to 0.
Nothing here imports Streamlit, so every builder is testable on small frames.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MS_PER_SECOND = 1000.0
MS_PER_NS = 1e-6
NO_DATA = "no data"
UNCLASSIFIED = "unclassified"

# Order of the per-stage table: what the user felt first, then the path from the edge inwards.
MEASURE_ORDER = ["client_ttft", "client_e2e", "ttft", "e2e", "itl", "gateway", "network",
                 "tokenize", "retrieval", "queue", "prefill", "decode", "model", "postprocess"]
MEASURE_LABELS = {
    "client_ttft": "TTFT (client)", "client_e2e": "E2E (client)", "ttft": "TTFT (server)",
    "e2e": "E2E (server)", "itl": "ITL", "gateway": "gateway (self time)",
    "network": "network", "tokenize": "tokenize", "retrieval": "retrieval", "queue": "queue",
    "prefill": "prefill", "decode": "decode", "model": "model call",
    "postprocess": "postprocess",
}
_REQUEST_DURATION_ORDER = ["client_e2e", "e2e", "client_ttft", "ttft", "itl", "gateway",
                           "network", "tokenize", "retrieval", "queue", "prefill", "decode",
                           "model", "postprocess"]
_REQUEST_IDENTITY_ORDER = ["status", "endpoint", "endpoint_class", "model", "input_tokens",
                           "output_tokens", "trace_id"]
STAGE_TABLE_COLUMNS = ["stage", "count", "avg_ms", "p50_ms", "p95_ms", "p99_ms"]

_CLASS_COLORS = {"interactive": "#1f77b4", "bulk": "#ff7f0e"}
_FALLBACK_COLORS = ["#d62728", "#9467bd", "#8c564b", "#e377c2"]
# Gauges get their own hues so an engine series is never mistaken for an endpoint class.
_GAUGE_COLORS = ["#2ca02c", "#17becf", "#7f7f7f", "#bcbd22", "#393b79", "#637939"]
_STAT_STYLES = [("p50_seconds", "p50", "solid"), ("p99_seconds", "p99", "dash"),
                ("avg_seconds", "avg", "dot")]


def ttft_with_queue_depth(ttft_df: pd.DataFrame, queue_df: pd.DataFrame, *,
                          step_seconds: float | None = None) -> go.Figure:
    """TTFT p50/p99/average per endpoint class over time, above the engine's queue depth.

    ``ttft_df``: rows ``bucket`` (UTC), ``endpoint_class``, ``avg_seconds``, ``p50_seconds``,
    ``p99_seconds`` (the read API's ``/timeseries/ttft``). ``queue_df``: rows ``bucket``,
    ``service_name``, ``attributes``, ``value`` (requests waiting; ``/timeseries/gauge``
    with ``metric=queue_depth``). Both panels share one time axis so a TTFT rise lines up
    with the queue that caused it. With ``step_seconds``, buckets missing inside a series
    become gaps. An empty input gives its panel a "no data" annotation. TTFT in ms.
    """
    figure = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                           row_heights=[0.62, 0.38],
                           subplot_titles=("Time to first token", "Engine queue depth"))
    ttft = _non_empty(ttft_df, ["p50_seconds", "p99_seconds", "avg_seconds"])
    if ttft.empty:
        _annotate_no_data(figure, row=1)
    else:
        # Spans without the resource attribute (e.g. vLLM's own) have no class: say so.
        ttft["endpoint_class"] = (ttft["endpoint_class"].fillna("").astype(str)
                                  .replace("", UNCLASSIFIED))
        for index, (endpoint_class, rows) in enumerate(ttft.groupby("endpoint_class",
                                                                    sort=True)):
            rows = _fill_gaps(rows, step_seconds)
            color = _CLASS_COLORS.get(endpoint_class,
                                      _FALLBACK_COLORS[index % len(_FALLBACK_COLORS)])
            for column, stat, dash in _STAT_STYLES:
                if column not in rows or rows[column].isna().all():
                    continue
                figure.add_trace(go.Scatter(
                    x=rows["bucket"], y=rows[column] * MS_PER_SECOND, mode="lines+markers",
                    name=f"{endpoint_class} {stat}", legendgroup=endpoint_class,
                    line={"color": color, "dash": dash}, marker={"size": 4},
                    connectgaps=False,
                    hovertemplate=f"{endpoint_class} {stat}: %{{y:.1f}} ms<extra></extra>",
                ), row=1, col=1)
    _add_gauge_traces(figure, queue_df, row=2, step_seconds=step_seconds,
                      unit_label="requests waiting")
    figure.update_yaxes(title_text="TTFT (ms)", rangemode="tozero", row=1, col=1)
    figure.update_yaxes(title_text="requests waiting", rangemode="tozero", row=2, col=1)
    figure.update_xaxes(title_text="time (UTC)", row=2, col=1)
    if not figure.data:
        figure.update_xaxes(showticklabels=False)
    figure.update_layout(height=560, margin={"l": 60, "r": 20, "t": 40, "b": 40},
                         legend={"orientation": "h", "y": -0.15}, hovermode="x unified")
    return figure


def gauge_over_time(gauge_df: pd.DataFrame, *, title: str, y_title: str,
                    scale: float = 1.0, step_seconds: float | None = None) -> go.Figure:
    """One canonical gauge (KV-cache usage, running requests, ...) per series over time.

    ``gauge_df``: rows ``bucket``, ``service_name``, ``attributes``, ``value``; ``scale``
    multiplies values for display (e.g. 100 for a ratio shown in percent). Empty input
    gives a "no data" annotation.
    """
    figure = make_subplots(rows=1, cols=1, subplot_titles=(title,))
    _add_gauge_traces(figure, gauge_df, row=1, step_seconds=step_seconds, unit_label=y_title,
                      scale=scale)
    figure.update_yaxes(title_text=y_title, rangemode="tozero")
    figure.update_xaxes(title_text="time (UTC)", showticklabels=bool(figure.data))
    figure.update_layout(height=300, margin={"l": 60, "r": 20, "t": 40, "b": 40},
                         legend={"orientation": "h", "y": -0.3})
    return figure


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
    table = pd.DataFrame({
        "stage": rows["measure"].map(lambda m: MEASURE_LABELS.get(m, m)),
        "count": pd.to_numeric(rows.get("count"), errors="coerce").fillna(0).astype("int64"),
    })
    for stat in ("avg", "p50", "p95", "p99"):
        column = f"{stat}_seconds"
        seconds = (pd.to_numeric(rows[column], errors="coerce") if column in rows
                   else pd.Series(np.nan, index=rows.index))
        table[f"{stat}_ms"] = seconds * MS_PER_SECOND
    return table.reset_index(drop=True)


def requests_table(requests_df: pd.DataFrame) -> pd.DataFrame:
    """Request rows for display: ``*_ns`` durations become ``*_ms`` columns, leading.

    Order: ``timestamp``, the durations (end-to-end and TTFT first, then the stages), then
    status, endpoint, class, model, tokens, ``trace_id`` and the rest. Duration columns
    that are null in every row (stages this deployment does not report) are left out;
    single nulls stay null, never 0.
    """
    table = requests_df.copy()
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
    leading = [c for c in ("timestamp",) if c in table] + durations
    identity = [c for c in _REQUEST_IDENTITY_ORDER if c in table]
    rest = [c for c in table.columns if c not in leading and c not in identity]
    return table[leading + identity + rest].reset_index(drop=True)


def series_label(service_name: object, attributes: object) -> str:
    """Legend label of one gauge series: ``service`` plus its attributes, e.g. ``vllm engine=0``.

    inferpath's own bookkeeping attributes (``inferpath.*``, such as the source metric
    name) are left out: they do not tell series apart.
    """
    label = str(service_name) if service_name not in (None, "") and not _is_nan(service_name) \
        else "unknown service"
    if isinstance(attributes, dict):
        shown = {k: v for k, v in attributes.items() if not str(k).startswith("inferpath.")}
        if shown:
            label += " " + " ".join(f"{key}={value}" for key, value in sorted(shown.items()))
    elif isinstance(attributes, str) and attributes not in ("", "{}"):
        label += f" {attributes}"
    return label


def _add_gauge_traces(figure: go.Figure, gauge_df: pd.DataFrame, *, row: int,
                      step_seconds: float | None, unit_label: str, scale: float = 1.0) -> None:
    gauge = _non_empty(gauge_df, ["value"])
    if gauge.empty:
        _annotate_no_data(figure, row=row)
        return
    service = gauge["service_name"] if "service_name" in gauge else pd.Series(None, index=gauge.index)
    attributes = gauge["attributes"] if "attributes" in gauge else pd.Series(None, index=gauge.index)
    gauge["_series"] = [series_label(s, a) for s, a in zip(service, attributes)]
    for index, (label, rows) in enumerate(gauge.groupby("_series", sort=True)):
        rows = _fill_gaps(rows, step_seconds)
        # A gauge holds its value until the next sample: draw steps, not slopes.
        figure.add_trace(go.Scatter(
            x=rows["bucket"], y=rows["value"] * scale, mode="lines", name=label,
            line={"shape": "hv", "color": _GAUGE_COLORS[index % len(_GAUGE_COLORS)]},
            connectgaps=False,
            hovertemplate=f"{label}: %{{y:.3g}} {unit_label}<extra></extra>",
        ), row=row, col=1)


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


def _annotate_no_data(figure: go.Figure, *, row: int) -> None:
    axis = "" if row == 1 else str(row)
    # Without data the axis ranges are placeholders (-1..6); numbers there would mislead.
    figure.update_yaxes(showticklabels=False, row=row, col=1)
    figure.add_annotation(text=NO_DATA, xref=f"x{axis} domain", yref=f"y{axis} domain",
                          x=0.5, y=0.5, showarrow=False, font={"size": 16, "color": "#888"})


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and np.isnan(value)
