"""The What-if view: the change a verdict's cause suggests, and the TTFT it would give.

The Overview's banner links here when the top cause is one the engine model of
``GET /api/v1/whatif`` can replay a change for (:data:`SUGGESTIONS`): a full KV cache
(more KV blocks) and a saturated engine (one more replica). Other causes (tokenization,
retrieval, a network hop, queueing upstream, the batch window, a cold start) are outside
the model: no link, rather than a prediction of nothing. The calibration does not measure
the batch window a deployment holds, so removing it would predict no change.

The view shows, per endpoint class, TTFT p50 and p99 as observed, as the model replays the
observed configuration (how far it can be trusted), and as predicted under the change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import pandas as pd
import streamlit as st

from inferpath.dashboard import messages, session
from inferpath.dashboard.client import ReadApiError
from inferpath.dashboard.figures import MS_PER_SECOND
from inferpath.dashboard.queries import load_whatif


@dataclass(frozen=True)
class Suggestion:
    """A change to predict for a cause: its words and its ``/whatif`` parameters.
    ``replicas_added``: engines to add to the calibrated count (which only the server knows,
    so it is read first)."""

    text: str
    params: tuple[tuple[str, str], ...] = ()
    replicas_added: int = 0


SUGGESTIONS: dict[str, Suggestion] = {
    "gpu_memory": Suggestion("twice the KV-cache blocks per engine", (("kv_blocks", "x2"),)),
    "gpu_compute": Suggestion("one more engine replica", replicas_added=1),
}
"""Cause (the diagnosis' registry name) → the change the What-if view predicts for it."""
CHANGE_PARAMS = ("kv_blocks", "replicas_added")
"""Query parameters of the What-if page that describe the change."""


def whatif_href(
    verdict: Mapping[str, Any] | None,
    *,
    start: datetime,
    end: datetime,
    tz: str,
    choices: Mapping[str, str] | None = None,
) -> str | None:
    """The What-if page for the verdict's top cause over the same window (``choices``: more
    query parameters to carry, the filters), or ``None`` when the cause has no
    :data:`SUGGESTIONS` entry."""
    cause = (verdict or {}).get("top_cause")
    suggestion = SUGGESTIONS.get(cause or "")
    if suggestion is None:
        return None
    change = dict(suggestion.params)
    if suggestion.replicas_added:
        change["replicas_added"] = str(suggestion.replicas_added)
    return "whatif?" + urlencode(
        {
            "start": session.iso_utc(start),
            "end": session.iso_utc(end),
            "tz": tz,
            "refresh": "0",
            **(choices or {}),
            "cause": cause,
            **change,
        }
    )


def change_from_url(params: Mapping[str, str]) -> tuple[str, dict[str, str], int]:
    """(words, ``/whatif`` parameters, replicas to add) from the page's URL."""
    cause = params.get("cause", "")
    words = SUGGESTIONS[cause].text if cause in SUGGESTIONS else "the change in the URL"
    change = {"kv_blocks": params["kv_blocks"]} if params.get("kv_blocks") else {}
    try:
        added = max(0, int(params.get("replicas_added", "0")))
    except ValueError:
        added = 0
    return words, change, added


def ttft_table(answer: Mapping[str, Any]) -> pd.DataFrame:
    """Per endpoint class (``all`` last): requests, and TTFT p50 and p99 in ms as observed,
    as replayed (observed configuration) and as predicted."""
    rows = []
    predicted = answer.get("predicted") or {}
    for klass in sorted(predicted, key=lambda c: (c == "all", c)):
        row: dict[str, Any] = {
            "endpoint class": klass,
            "requests": (answer.get("observed", {}).get(klass) or {}).get("requests"),
        }
        for source in ("observed", "replayed", "predicted"):
            figures = (answer.get(source) or {}).get(klass) or {}
            for quantile in ("p50", "p99"):
                value = figures.get(f"ttft_{quantile}_seconds")
                row[f"{source} TTFT {quantile} (ms)"] = None if value is None else value * MS_PER_SECOND
        rows.append(row)
    return pd.DataFrame(rows)


def ttft_replay_error(answer: Mapping[str, Any]) -> float | None:
    """The largest relative error of the replayed TTFT p50/p99 against the observed, over
    the classes (``calibration_errors``), or ``None`` when the answer has none."""
    errors = [
        float(value)
        for by_measure in (answer.get("calibration_errors") or {}).values()
        for measure, value in (by_measure or {}).items()
        if measure.startswith("ttft") and isinstance(value, (int, float))
    ]
    return max((abs(e) for e in errors), default=None)


def whatif_panel(server_url: str, token: str | None, start: datetime, end: datetime) -> None:
    """The What-if page body for ``[start, end)`` and the change the URL names."""
    words, change, added = change_from_url(st.query_params)
    if not change and not added:
        st.info(
            "No change to predict: open this page from the Overview's verdict, whose cause "
            "names one (a full KV cache, or an engine at its batch limit)."
        )
        return
    st.subheader(f"Predicted TTFT with {words}")
    with st.spinner("Replaying the window through the engine model…"):
        try:
            if added:
                observed = load_whatif(server_url, token, start, end, ())
                replicas = int((observed.get("calibration") or {}).get("replicas") or 1)
                change = {**change, "replicas": str(replicas + added)}
            answer = load_whatif(server_url, token, start, end, tuple(sorted(change.items())))
        except ReadApiError as error:
            st.warning(messages.explain(error, what="a prediction for this window", server_url=server_url))
            return
    st.caption(
        f"Change: {answer.get('change_text', '')}. Observed: what the window's requests "
        f"met; replayed: the engine model running the observed configuration (how far "
        f"it can be trusted); predicted: the same requests under the change."
    )
    table = ttft_table(answer)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            column: st.column_config.NumberColumn(column, format="%.0f")
            for column in table.columns
            if column.endswith("(ms)")
        },
    )
    worst = ttft_replay_error(answer)
    if worst is not None:
        st.caption(
            f"The replay's TTFT is within {worst * 100:.0f} % of what was observed (the server "
            f"refuses beyond {float(answer.get('max_calibration_error', 0.3)) * 100:.0f} %)."
        )
    for line in [*(answer.get("warnings") or []), *(answer.get("notes") or [])]:
        st.caption(f"note: {line}")


__all__ = [
    "CHANGE_PARAMS",
    "SUGGESTIONS",
    "Suggestion",
    "change_from_url",
    "ttft_replay_error",
    "ttft_table",
    "whatif_href",
    "whatif_panel",
]
