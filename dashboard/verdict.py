"""The Overview's verdict: the banner and the objective tiles, as pure functions.

Inputs are the JSON of ``/api/v1/diagnosis`` (see :func:`inferpath.analysis.verdict_to_dict`)
and of ``/api/v1/objectives``; outputs are small dataclasses and HTML fragments the page
draws. The banner answers the 30-second questions in one line each: is latency degraded
against the objectives, what is the top cause, and what is the one thing to do about it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferpath.dashboard.figures import MS_PER_NS, MS_PER_SECOND
from inferpath.vocabulary import UNCLASSIFIED

# Tile and banner colours: (background, border). Met is green, broken red, "met but much
# worse than before" amber, not judged grey.
STATE_COLORS = {
    "met": ("#e8f5e9", "#2e7d32"),
    "broken": ("#ffebee", "#c62828"),
    "worse": ("#fff8e1", "#f9a825"),
    "unknown": ("#f5f5f5", "#9e9e9e"),
}
WORSE_THAN_BASELINE_RATIO = 1.5
"""A tile that meets its objective turns amber when its value is this many times the one of
the window before: the objective still holds, but something changed."""
CAUSE_LABELS = {
    "tokenization": "tokenization",
    "retrieval": "retrieval",
    "network_hop": "a network hop",
    "queueing": "queueing upstream of the engine",
    "batching": "the batch window",
    "gpu_compute": "GPU compute capacity",
    "gpu_memory": "GPU memory (KV cache full)",
    "cold_start": "a cold start",
    "unexplained": "unexplained time",
}


@dataclass(frozen=True)
class Banner:
    """The verdict banner: ``state`` (``healthy``, ``degraded`` or ``unknown``), a headline,
    the top cause (its registry name, or ``None``), the one action, and the summary line."""

    state: str
    headline: str
    cause: str | None = None
    action: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Tile:
    """One Overview tile: ``label`` (``interactive TTFT p99``), ``value_ms`` (``None``: not
    measured), the objective in ms (``None``: none), the value of the window before
    (``baseline_ms``), and ``state`` (a key of :data:`STATE_COLORS`)."""

    label: str
    value_ms: float | None
    objective_ms: float | None
    baseline_ms: float | None
    state: str
    note: str = ""
    value_text: str | None = None
    """Shown instead of ``value_ms`` (a count, for instance)."""


def banner_of(verdict: Mapping[str, Any] | None, *, no_verdict: str | None = None) -> Banner:
    """The banner of a verdict, or of a window without one (``no_verdict``: why, a sentence).

    Degraded: which objective broke (from ``summary``), the top cause with its share, and
    the first ``would_help`` of the top cause as the action. Healthy: the objectives held.
    """
    if verdict is None:
        return Banner("unknown", "No verdict for this window", detail=no_verdict or "")
    summary = str(verdict.get("summary", ""))
    detail = summary.split(": ", 1)[1] if ": " in summary else summary
    if verdict.get("healthy"):
        return Banner("healthy", "Healthy: every latency objective holds", detail=detail)
    top = verdict.get("top_cause")
    cause = next((c for c in verdict.get("causes", []) if c.get("cause") == top), None)
    action = None
    if cause is not None and cause.get("would_help"):
        action = str(cause["would_help"][0])
    if not verdict.get("measure") and (verdict.get("failed_share") or 0) > 0:  # the latency held; requests failed
        headline = f"Degraded: {verdict['failed_share'] * 100:.0f} % of requests failed"
        if cause is not None and top == "cold_start":
            headline += f", {min(1.0, cause.get('share') or 0.0) * 100:.0f} % of them on a replica still starting"
        action = action or "look at why they failed: their HTTP status and the service's or engine's logs"
        return Banner("degraded", headline, cause=top, action=action, detail=detail)
    if top and top != "unexplained":
        share = (
            f" ({min(1.0, cause['share']) * 100:.0f} % of the slow requests' time)"
            if cause is not None and cause.get("share") is not None
            else ""
        )
        headline = f"Degraded: the bottleneck is {CAUSE_LABELS.get(top, top)}{share}"
    else:
        headline = "Degraded: no cause explains the slow requests"
    return Banner("degraded", headline, cause=top, action=action, detail=detail)


def banner_html(banner: Banner, *, evidence_href: str | None, whatif: tuple[str, str] | None = None) -> str:
    """The banner as one HTML block (escaped text); ``data-verdict`` carries the state and
    ``data-cause`` the top cause, for tests and for anyone scraping the page. ``whatif``:
    (the suggested change in words, the What-if page's href) when the cause has one."""
    background, border = STATE_COLORS[{"healthy": "met", "degraded": "broken"}.get(banner.state, "unknown")]
    lines = [f'<div style="font-size:1.35rem;font-weight:600">{html.escape(banner.headline)}</div>']
    if banner.detail:
        lines.append(f"<div>{html.escape(banner.detail)}</div>")
    if banner.action:
        lines.append(f"<div><b>Do this:</b> {html.escape(banner.action)}</div>")
    if evidence_href:
        lines.append(
            f'<div><a href="{html.escape(evidence_href)}" target="_self">'
            f"See the evidence on the Diagnosis page →</a></div>"
        )
    if whatif:
        words, href = whatif
        lines.append(
            f'<div><a class="inferpath-whatif" href="{html.escape(href)}" target="_self">'
            f"What would {html.escape(words)} do? See the predicted TTFT →</a></div>"
        )
    return (
        f'<div class="inferpath-verdict" data-verdict="{banner.state}" '
        f'data-cause="{html.escape(banner.cause or "")}" style="background:{background};'
        f"border-left:6px solid {border};padding:0.8rem 1rem;border-radius:4px;"
        f'margin-bottom:0.6rem">{"".join(lines)}</div>'
    )


def objective_limits(
    objectives: Mapping[str, Any] | None, endpoint_class: str | None, measure: str = "ttft"
) -> dict[str, float]:
    """Class → p99 limit of ``measure`` in ms from ``/api/v1/objectives``; only the chosen
    class when ``endpoint_class`` is given (its default class's when it has none)."""
    if not objectives:
        return {}
    by_class = objectives.get("by_class", {})
    limits = {
        name: float(o["limit_seconds"]) * MS_PER_SECOND
        for name, rows in by_class.items()
        for o in rows
        if o.get("measure") == measure and abs(float(o.get("quantile", 0)) - 0.99) < 1e-9
    }
    if endpoint_class is None:
        return limits
    chosen = endpoint_class if endpoint_class in limits else objectives.get("default_class")
    return {endpoint_class: limits[chosen]} if chosen in limits else {}


def objective_tiles(
    verdict: Mapping[str, Any] | None, baseline_ms: Mapping[tuple[str, str], float | None]
) -> list[Tile]:
    """One tile per objective the verdict judged (class × measure): green when met, red when
    broken, amber when met but at least :data:`WORSE_THAN_BASELINE_RATIO` × the window
    before (``baseline_ms``, keyed by (class, measure)); grey when nothing measured it."""
    tiles = []
    for row in (verdict or {}).get("objectives", []):
        klass, measure = row.get("endpoint_class") or UNCLASSIFIED, row["measure"]
        value = None if row.get("value_ns") is None else row["value_ns"] * MS_PER_NS
        limit = row["limit_ns"] * MS_PER_NS
        before = baseline_ms.get((klass, measure))
        if value is None:
            state, note = "unknown", "not measured in this window"
        elif not row.get("met"):
            state, note = "broken", f"over the objective by {value - limit:.0f} ms"
        elif before and value >= WORSE_THAN_BASELINE_RATIO * before:
            state, note = "worse", f"{value / before:.1f}× the window before"
        else:
            state, note = "met", f"{value / limit * 100:.0f} % of the objective"
        label = f"{klass} {measure.upper()} p{float(row.get('quantile', 0.99)) * 100:g}"
        tiles.append(Tile(label, value, limit, before, state, note))
    return tiles


def tile_html(tile: Tile) -> str:
    """A tile as an HTML block: label, value, the objective and the window before."""
    background, border = STATE_COLORS[tile.state]
    value = tile.value_text or ("–" if tile.value_ms is None else f"{tile.value_ms:,.0f} ms")
    lines = [
        f'<div style="font-size:0.85rem;color:#555">{html.escape(tile.label)}</div>',
        f'<div style="font-size:1.6rem;font-weight:600">{value}</div>',
    ]
    sub = []
    if tile.objective_ms is not None:
        sub.append(f"objective ≤ {tile.objective_ms:,.0f} ms")
    if tile.baseline_ms is not None:
        sub.append(f"before: {tile.baseline_ms:,.0f} ms")
    if sub:
        lines.append(f'<div style="font-size:0.8rem">{html.escape(" · ".join(sub))}</div>')
    if tile.note:
        lines.append(f'<div style="font-size:0.8rem;color:{border}">{html.escape(tile.note)}</div>')
    return (
        f'<div class="inferpath-tile" data-state="{tile.state}" style="background:{background};'
        f'border-top:4px solid {border};padding:0.5rem 0.7rem;border-radius:4px">'
        f"{''.join(lines)}</div>"
    )


def slot_limit(verdict: Mapping[str, Any] | None) -> float | None:
    """The running-batch limit the diagnosis used (``engine.slot_limit``), if any."""
    engine = (verdict or {}).get("engine") or {}
    value = engine.get("slot_limit")
    return float(value) if isinstance(value, (int, float)) else None


def classes_of(verdict: Mapping[str, Any] | None) -> Sequence[str]:
    """Endpoint classes the verdict judged, in order of first appearance."""
    return list(
        dict.fromkeys((row.get("endpoint_class") or UNCLASSIFIED) for row in (verdict or {}).get("objectives", []))
    )
