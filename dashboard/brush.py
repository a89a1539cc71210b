"""A box dragged across a time chart becomes the window of every page.

Time charts are drawn with plotly's box selection along the time axis
(:data:`BRUSH_LAYOUT`: ``dragmode="select"``, ``selectdirection="h"``), and
``st.plotly_chart(on_select="rerun")`` reports the box to the script. :func:`time_chart`
turns the box's time span into the session's window (:func:`session.choose_window`) and
reruns the whole app, so the sidebar shows the new window to the second and every page,
and the URL, follow it. The chart's key carries the choices' version, so after the window
changes the new chart starts without a selection (the old one would apply again).

Only the box's time span counts (its height is ignored). Zoom stays in the chart's toolbar;
a double click resets a zoom, as in any plotly chart.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from inferpath.dashboard import session
from inferpath.dashboard.figures import BRUSH_LAYOUT

MIN_BRUSH = timedelta(seconds=1)
"""A shorter span is a click, not a window."""


def brushed_window(event: Mapping[str, Any] | None, tz: str) -> tuple[datetime, datetime] | None:
    """The time span of the last box in ``event`` (what ``st.plotly_chart`` returns with
    selections on) as aware UTC instants, or ``None`` without a box or for a span shorter
    than :data:`MIN_BRUSH`; widened to whole seconds. The box's x values are wall times of ``tz`` (every time axis
    of the dashboard draws wall times: :func:`figures.wall_time`); a wall time that does
    not exist or repeats at a DST change is taken as the earlier instant."""
    boxes = ((event or {}).get("selection") or {}).get("box") or []
    if not boxes:
        return None
    xs = boxes[-1].get("x") or []
    if len(xs) < 2:
        return None
    try:
        walls = sorted(pd.Timestamp(x) for x in xs)
    except (TypeError, ValueError):
        return None  # a box on an axis that is not time
    # Whole seconds, outwards: the window holds the whole span and reads cleanly in the URL.
    start, end = (
        wall.tz_localize(tz, ambiguous=True, nonexistent="shift_backward").tz_convert("UTC")
        for wall in (walls[0].floor("s"), walls[-1].ceil("s"))
    )
    if end - start < pd.Timedelta(MIN_BRUSH):
        return None
    return start.to_pydatetime(), end.to_pydatetime()


def time_chart(figure: go.Figure, *, key: str, tz: str) -> None:
    """Draw ``figure`` (a time chart laid out with :data:`BRUSH_LAYOUT`); a box dragged
    across it sets the window of every page and reruns the app."""
    event = st.plotly_chart(
        figure, width="stretch", key=f"{key}_{session.version()}", on_select="rerun", selection_mode=("box",)
    )
    window = brushed_window(event, tz)
    if window is not None:
        session.choose_window(*window)
        st.rerun(scope="app")


__all__ = ["BRUSH_LAYOUT", "MIN_BRUSH", "brushed_window", "time_chart"]
