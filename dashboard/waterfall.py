"""The waterfall of one request: every span of a trace across processes, on one time line.

Input: the spans of ``GET /api/v1/traces/{id}`` (``start_ns``/``end_ns`` Unix ns, ids,
``service_name``, ``span_name``, ``span_kind``, ``span_attributes`` as strings). Bars are
placed by offset from the trace's first span, in milliseconds, children under parents.

Marks (from attributes, nothing invented):

- first token: span start + ``gen_ai.response.time_to_first_chunk`` (client, gateway) or
  + ``gen_ai.latency.time_to_first_token`` (vLLM's ``llm_request``);
- tokens: the spans record no per-token times, only the mean ITL
  (``inferpath.itl_seconds``) and the token count (``inferpath.stream.chunks`` or
  ``gen_ai.usage.output_tokens``), so the token ticks are placed at the first token plus
  multiples of the mean ITL and labelled as such; the last tick is the span end;
- engine phases: vLLM's ``time_in_queue``, ``time_in_model_prefill`` and
  ``time_in_model_decode`` drawn inside the ``llm_request`` bar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from inferpath.dashboard.figures import MS_PER_NS, MS_PER_SECOND
from inferpath.vocabulary import GEN_AI_LATENCY_TTFT, GEN_AI_TIME_TO_FIRST_CHUNK

TTFT_KEYS = (GEN_AI_TIME_TO_FIRST_CHUNK, GEN_AI_LATENCY_TTFT)
TOKEN_COUNT_KEYS = ("inferpath.stream.chunks", "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
ENGINE_PHASES = (
    ("queue", "gen_ai.latency.time_in_queue", "#d62728"),
    ("prefill", "gen_ai.latency.time_in_model_prefill", "#ff7f0e"),
    ("decode", "gen_ai.latency.time_in_model_decode", "#1f77b4"),
)
MAX_TOKEN_MARKS = 200
"""More ticks than this on one bar are unreadable; a long answer shows its first 200."""
_KIND_COLORS = {"Server": "#9467bd", "Client": "#8c564b", "Internal": "#7f7f7f"}


def _number(attributes: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        try:
            value = float(attributes[key])
        except (KeyError, TypeError, ValueError):
            continue
        if value == value and value >= 0:  # NaN and negatives are not measurements
            return value
    return None


def span_rows(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans in waterfall order (depth-first from the roots, children by start) with
    ``depth``, ``offset_ms`` (from the trace's first start), ``duration_ms`` and ``label``
    (``service · name``, indented by depth). Spans whose parent is not in the trace count
    as roots. Empty input gives an empty frame."""
    if spans.empty:
        return spans.assign(depth=[], offset_ms=[], duration_ms=[], label=[])
    frame = spans.sort_values(["start_ns", "span_id"]).reset_index(drop=True)
    ids = set(frame["span_id"])
    children: dict[str, list[int]] = {}
    roots: list[int] = []
    for index, parent in enumerate(frame["parent_span_id"].fillna("")):
        (children.setdefault(parent, []) if parent in ids else roots).append(index)
    order: list[tuple[int, int]] = []
    stack = [(index, 0) for index in reversed(roots)]
    while stack:
        index, depth = stack.pop()
        order.append((index, depth))
        stack.extend((child, depth + 1) for child in reversed(children.get(frame.at[index, "span_id"], [])))
    rows = frame.loc[[index for index, _ in order]].copy()
    rows["depth"] = [depth for _, depth in order]
    trace_start_ns = int(frame["start_ns"].min())
    rows["offset_ms"] = (rows["start_ns"] - trace_start_ns) * MS_PER_NS
    rows["duration_ms"] = (rows["end_ns"] - rows["start_ns"]) * MS_PER_NS
    rows["label"] = [
        "\u2003" * depth + f"{service} · {name}"
        for depth, service, name in zip(rows["depth"], rows["service_name"], rows["span_name"])
    ]
    return rows.reset_index(drop=True)


def waterfall_figure(spans: pd.DataFrame) -> go.Figure:
    """Horizontal bars, one per span (:func:`span_rows` order), with first-token and token
    marks and the engine's queue/prefill/decode phases (module docstring). x: ms since the
    trace's first span started."""
    rows = span_rows(spans)
    figure = go.Figure()
    if rows.empty:
        return figure
    labels = list(rows["label"])
    figure.add_trace(
        go.Bar(
            y=labels,
            x=rows["duration_ms"],
            base=rows["offset_ms"],
            orientation="h",
            name="span",
            marker_color=[_KIND_COLORS.get(kind, "#7f7f7f") for kind in rows["span_kind"]],
            customdata=rows[["span_kind", "duration_ms"]].values,
            hovertemplate="%{y}<br>%{customdata[0]} · %{customdata[1]:.1f} ms<extra></extra>",
        )
    )
    first_x, first_y, tick_x, tick_y = [], [], [], []
    for _, span in rows.iterrows():
        attributes = span["span_attributes"] if isinstance(span["span_attributes"], dict) else {}
        offset_ms = span["offset_ms"]
        phase_start_ms = offset_ms  # the phases follow each other from the span's start
        for phase, key, color in ENGINE_PHASES:
            seconds = _number(attributes, (key,))
            if seconds is None:
                continue
            figure.add_trace(
                go.Bar(
                    y=[span["label"]],
                    x=[seconds * MS_PER_SECOND],
                    base=[phase_start_ms],
                    orientation="h",
                    width=0.35,
                    marker_color=color,
                    name=phase,
                    legendgroup=phase,
                    showlegend=phase not in {t.name for t in figure.data},
                )
            )
            phase_start_ms += seconds * MS_PER_SECOND
        ttft_seconds = _number(attributes, TTFT_KEYS)
        if ttft_seconds is None:
            continue
        first_ms = offset_ms + ttft_seconds * MS_PER_SECOND
        first_x.append(first_ms)
        first_y.append(span["label"])
        itl_seconds = _number(attributes, ("inferpath.itl_seconds",))
        tokens = _number(attributes, TOKEN_COUNT_KEYS)
        if itl_seconds and tokens and tokens >= 2:
            for k in range(1, int(min(tokens, MAX_TOKEN_MARKS))):
                tick_x.append(first_ms + k * itl_seconds * MS_PER_SECOND)
                tick_y.append(span["label"])
    if first_x:
        figure.add_trace(
            go.Scatter(
                x=first_x,
                y=first_y,
                mode="markers",
                name="first token (TTFT)",
                marker={"symbol": "diamond", "size": 12, "color": "#000"},
            )
        )
    if tick_x:
        figure.add_trace(
            go.Scatter(
                x=tick_x,
                y=tick_y,
                mode="markers",
                name="tokens (at mean ITL)",
                marker={"symbol": "line-ns-open", "size": 10, "color": "#444"},
            )
        )
    figure.update_layout(
        barmode="overlay",
        height=120 + 36 * len(rows),
        xaxis_title="ms since the request started",
        yaxis={"autorange": "reversed", "type": "category"},
        margin={"l": 20, "r": 20, "t": 30, "b": 40},
        legend={"orientation": "h", "y": -0.15},
    )
    return figure


__all__ = ["ENGINE_PHASES", "MAX_TOKEN_MARKS", "span_rows", "waterfall_figure"]
