"""Figures of stacked rows on one shared time axis, built as plain dicts, validated once.

Every time-series figure of the dashboard is a column of panels over one time axis. Built
with plotly's helpers (``make_subplots``, then ``add_trace``/``add_hline``/``add_annotation``
with ``row=``), each call validates its piece and scans every subplot: the Overview's figure
took 225-650 ms to build and ``add_hline`` alone 45 % of it, on every first visit of a window.
:class:`StackedRows` lays the panels out itself (the same axes, domains and titles as
``make_subplots(rows=n, cols=1, shared_xaxes=True)``) and collects traces, shapes,
annotations and axis settings as dicts; :meth:`StackedRows.figure` makes the
``go.Figure`` in one call (about 17 ms for 17 traces of 360 points).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

TITLE_FONT_SIZE = 16
"""Panel titles, as ``make_subplots`` draws them."""


def axis_names(row: int) -> tuple[str, str]:
    """``(x, y)`` axis references of ``row`` (1-based): ``("x", "y")``, ``("x2", "y2")``, ..."""
    suffix = "" if row == 1 else str(row)
    return f"x{suffix}", f"y{suffix}"


class StackedRows:
    """``len(titles)`` panels from top to bottom sharing the bottom panel's x axis.

    ``row_heights``: relative heights (default equal); ``vertical_spacing``: the gap between
    panels as a fraction of the plot height. Rows are 1-based, as in ``make_subplots``.
    Values are not checked here: :meth:`figure` validates everything once and raises
    plotly's ``ValueError`` naming a bad property.
    """

    def __init__(
        self, titles: Sequence[str], *, row_heights: Sequence[float] | None = None, vertical_spacing: float = 0.04
    ) -> None:
        self.rows = len(titles)
        heights = list(row_heights or [1.0] * self.rows)
        usable = 1.0 - vertical_spacing * (self.rows - 1)
        total = sum(heights)
        self.layout: dict[str, Any] = {}
        self.traces: list[dict[str, Any]] = []
        self.shapes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []
        bottom_x, _ = axis_names(self.rows)
        top = 1.0
        for row, (title, height) in enumerate(zip(titles, heights), start=1):
            x, y = axis_names(row)
            low = max(0.0, top - usable * height / total)
            self.layout[f"xaxis{x[1:]}"] = {"anchor": y, "domain": [0.0, 1.0]}
            self.layout[f"yaxis{y[1:]}"] = {"anchor": x, "domain": [low, top]}
            if row < self.rows:
                self.layout[f"xaxis{x[1:]}"].update(matches=bottom_x, showticklabels=False)
            if title:
                self.annotations.append(
                    {
                        "text": title,
                        "font": {"size": TITLE_FONT_SIZE},
                        "showarrow": False,
                        "xref": "paper",
                        "x": 0.5,
                        "xanchor": "center",
                        "yref": "paper",
                        "y": top,
                        "yanchor": "bottom",
                    }
                )
            top = low - vertical_spacing

    def trace(self, row: int, trace: dict[str, Any]) -> None:
        """Add ``trace`` (a plotly trace as a dict, with its ``type``) to ``row``.

        ``x`` and ``y`` become numpy arrays (times as ``datetime64``, values as floats with
        ``NaN`` for ``None``: a gap, sent as ``null``): plotly validates and copies a list
        element by element, an array at once (half the build time of a 360-point figure)."""
        x_axis, y_axis = axis_names(row)
        self.traces.append(
            {**trace, "x": _array(trace.get("x")), "y": _array(trace.get("y")), "xaxis": x_axis, "yaxis": y_axis}
        )

    def xaxis(self, row: int, **props: Any) -> None:
        """Set properties of ``row``'s x axis (``title``, ``range``, ...)."""
        self.layout[f"xaxis{axis_names(row)[0][1:]}"].update(props)

    def xaxes(self, **props: Any) -> None:
        """Set properties of every x axis (spikes, for instance)."""
        for row in range(1, self.rows + 1):
            self.xaxis(row, **props)

    def yaxis(self, row: int, **props: Any) -> None:
        """Set properties of ``row``'s y axis (``title``, ``rangemode``, ...)."""
        self.layout[f"yaxis{axis_names(row)[1][1:]}"].update(props)

    def note(self, row: int, text: str, *, size: int = 13, color: str = "#888") -> None:
        """A sentence in the middle of ``row`` (why it is empty); hides its y tick labels,
        which would be placeholders."""
        x, y = axis_names(row)
        self.yaxis(row, showticklabels=False)
        self.annotations.append(
            {
                "text": text,
                "xref": f"{x} domain",
                "yref": f"{y} domain",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": size, "color": color},
            }
        )

    def label(self, row: int, text: str, *, x: Any, y: float = 0.9, size: int = 11, color: str = "#555") -> None:
        """A left-anchored label at time ``x`` near the top of ``row``."""
        x_axis, y_axis = axis_names(row)
        self.annotations.append(
            {
                "text": text,
                "xref": x_axis,
                "yref": f"{y_axis} domain",
                "x": x,
                "y": y,
                "xanchor": "left",
                "showarrow": False,
                "font": {"size": size, "color": color},
            }
        )

    def hline(
        self, row: int, y: float, *, line: dict[str, Any], label: str = "", label_font: dict[str, Any] | None = None
    ) -> None:
        """A horizontal line across ``row`` at ``y``, labelled at its top left (as
        ``add_hline(annotation_position="top left")``)."""
        x_axis, y_axis = axis_names(row)
        self.shapes.append(
            {
                "type": "line",
                "xref": f"{x_axis} domain",
                "x0": 0,
                "x1": 1,
                "yref": y_axis,
                "y0": y,
                "y1": y,
                "line": line,
            }
        )
        if label:
            self.annotations.append(
                {
                    "text": label,
                    "xref": f"{x_axis} domain",
                    "x": 0,
                    "xanchor": "left",
                    "yref": y_axis,
                    "y": y,
                    "yanchor": "bottom",
                    "showarrow": False,
                    "font": label_font or {},
                }
            )

    def vrect(self, row: int, x0: Any, x1: Any, *, fillcolor: str) -> None:
        """A shaded time span over the height of ``row``, behind the traces."""
        x_axis, y_axis = axis_names(row)
        self.shapes.append(
            {
                "type": "rect",
                "xref": x_axis,
                "x0": x0,
                "x1": x1,
                "yref": f"{y_axis} domain",
                "y0": 0,
                "y1": 1,
                "fillcolor": fillcolor,
                "line": {"width": 0},
                "layer": "below",
            }
        )

    def band(self, x0: Any, x1: Any, *, fillcolor: str) -> None:
        """A shaded time span over every row (they all read the bottom row's x axis)."""
        self.shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "x0": x0,
                "x1": x1,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "fillcolor": fillcolor,
                "line": {"width": 0},
                "layer": "below",
            }
        )

    def figure(self, **layout: Any) -> go.Figure:
        """The figure, validated once; ``layout`` adds top-level layout properties."""
        return go.Figure(
            data=self.traces, layout={**self.layout, **layout, "shapes": self.shapes, "annotations": self.annotations}
        )


def _array(values: Any) -> Any:
    if values is None or isinstance(values, np.ndarray):
        return values
    if isinstance(values, pd.Series):
        return values.to_numpy()
    try:
        return np.array([np.nan if value is None else value for value in values], dtype=float)
    except (TypeError, ValueError):  # not numbers (times as text, categories): as given
        return values


__all__ = ["StackedRows", "axis_names"]
