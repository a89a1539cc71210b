"""The sidebar's filters (endpoint class, service, model, replica) and which read-API routes
take them.

A filter is sent only to a route whose handler declares it (:data:`READ_API_FILTERS`,
copied from ``server/read_api.py``): the server answers 422 to a query parameter it does
not know, and a filter that silently did nothing would show unfiltered numbers as if they
were filtered. Where a page reads a route that cannot apply an active filter, the page says
so in a sentence (:func:`not_applied_note`). When the server learns a filter, adding it to
the route's entry here is the whole change on the dashboard's side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

FILTER_LABELS = {"endpoint_class": "endpoint class", "service": "service", "model": "model", "replica": "replica"}
"""Filter (query parameter) → how a sentence names it."""

READ_API_FILTERS: dict[str, frozenset[str]] = {
    "/api/v1/summary": frozenset({"endpoint_class", "service", "model", "replica"}),
    "/api/v1/requests": frozenset({"endpoint_class", "service", "model", "replica"}),
    "/api/v1/views/latency": frozenset({"endpoint_class", "service", "model", "replica"}),
    "/api/v1/views/breakdown": frozenset({"endpoint_class", "service", "model", "replica"}),
    "/api/v1/views/correlate": frozenset({"endpoint_class", "service", "model", "replica"}),
    "/api/v1/views/signals": frozenset(),
    "/api/v1/views/fleet": frozenset(),
    "/api/v1/timeseries/gauge": frozenset(),
    "/api/v1/diagnosis": frozenset({"endpoint_class", "service", "model", "replica"}),
    "/api/v1/alerts": frozenset(),
    "/api/v1/whatif": frozenset(),
}
"""Route → the filters of :class:`Filters` its handler takes (``server/read_api.py``)."""
SHARED_STATE_ROUTES = frozenset({"/api/v1/views/signals", "/api/v1/views/fleet", "/api/v1/timeseries/gauge"})
"""Engine and GPU state: one engine serves every endpoint class, so a class filter has no
meaning there (and is not reported as missing)."""


@dataclass(frozen=True)
class Filters:
    """What the sidebar narrows every page to; ``None`` means all."""

    endpoint_class: str | None = None
    service: str | None = None
    model: str | None = None
    replica: str | None = None

    def active(self) -> dict[str, str]:
        """Filter name → value, for the filters that are set."""
        return {name: value for name, value in asdict(self).items() if value}

    def as_params(self) -> dict[str, str]:
        """The active filters as query parameters (the URL's, and the read API's names)."""
        return self.active()

    def for_route(self, route: str) -> tuple[tuple[str, str], ...]:
        """The active filters ``route`` takes, as sorted pairs (hashable: a cache key)."""
        taken = READ_API_FILTERS.get(route, frozenset())
        return tuple(sorted((name, value) for name, value in self.active().items() if name in taken))


def not_applied_note(filters: Filters, routes: Iterable[str]) -> str | None:
    """A sentence naming each active filter that some of ``routes`` (what a page reads)
    cannot apply, and what to do; ``None`` when every route applies every active filter."""
    routes = list(routes)
    missing = []
    for name, value in filters.active().items():
        refusing = [
            route.removeprefix("/api/v1")
            for route in routes
            if name not in READ_API_FILTERS.get(route, frozenset())
            and not (name == "endpoint_class" and route in SHARED_STATE_ROUTES)
        ]
        if refusing:
            missing.append((name, value, refusing))
    if not missing:
        return None
    parts = [f"{FILTER_LABELS[name]} = {value} ({', '.join(refusing)})" for name, value, refusing in missing]
    return (
        f"Not filtered here by {'; '.join(parts)}: the server's read API does not take "
        f"{'this filter' if len(missing) == 1 else 'these filters'} on the routes named, so "
        f"those panels show every value. Clear the filter in the sidebar to compare like "
        f"with like."
    )


__all__ = ["FILTER_LABELS", "Filters", "READ_API_FILTERS", "SHARED_STATE_ROUTES", "not_applied_note"]
