"""Engine start-ups (cold starts) read from the engine's own start-up spans.

vLLM traces its start-up when ``--otlp-traces-endpoint`` is set (``--collect-detailed-traces
all`` adds the inner phases): one trace whose root span is ``Overall Loading`` and whose
descendants are ``Load weights``, ``Load model``, ``Allocate KV cache``, ``Warmup (CPU)``,
``EngineCoreProc init`` and so on (``shared/data/vllm_live_capture/startup_otlp``: a 35 s
CPU start-up). The emulated engine records the same names. Every span is INTERNAL and no
request is in these traces, so the request assembler leaves them out of
``inferpath_requests``; this module finds them in ``otel_traces`` instead.

A start-up is attributed to a replica by the root span's resource, with the same precedence
the assembler uses for request rows (``inferpath.replica``, then ``service.instance.id``,
then ``host.name``), so requests served by a replica can be matched to its start-up. (vLLM
runs its engine core and workers in separate processes with their own instance ids: only the
root's id names the replica, and it matches request spans of the API-server process.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

STARTUP_ROOT_SPAN = "Overall Loading"
"""Name of the root span of a vLLM start-up trace."""
REPLICA_ATTRIBUTES: tuple[str, ...] = ("inferpath.replica", "service.instance.id", "host.name")


@dataclass(frozen=True)
class ReplicaStartup:
    """One engine start-up.

    ``replica``: the root span's replica identity (see module docstring; ``""`` if none);
    ``started_at`` / ``ready_at``: wall-clock start and end of ``Overall Loading`` (UTC);
    ``loading_seconds``: its duration; ``phases_seconds``: descendant span name → seconds (the
    longest span of that name, since vLLM nests e.g. ``Worker init`` inside itself).
    """

    trace_id: str
    service_name: str
    replica: str
    started_at: datetime
    ready_at: datetime
    loading_seconds: float
    phases_seconds: dict[str, float] = field(default_factory=dict)

    def text(self) -> str:
        """``replica X loaded in 35.5 s (Warmup (CPU) 13.0 s, Load weights 0.02 s, …)``."""
        phases = ", ".join(
            f"{name} {seconds:.2f} s"
            for name, seconds in sorted(self.phases_seconds.items(), key=lambda kv: -kv[1])[:4]
        )
        return f"replica {self.replica or self.service_name} loaded in {self.loading_seconds:.1f} s" + (
            f" ({phases})" if phases else ""
        )


def startups_from_spans(spans: Iterable[Mapping[str, Any]]) -> list[ReplicaStartup]:
    """Start-ups among ``spans`` (dicts with ``trace_id``, ``span_id``, ``parent_span_id``,
    ``span_name``, ``timestamp`` (aware datetime, span start), ``duration_ns``,
    ``service_name``, ``resource_attributes``), oldest first.

    Each ``Overall Loading`` span is one start-up; its phases are the spans below it in the
    same trace. Raises ``ValueError`` naming the field for a negative ``duration_ns``.
    """
    by_trace: dict[str, list[Mapping[str, Any]]] = {}
    for span in spans:
        if int(span["duration_ns"]) < 0:
            raise ValueError(f"duration_ns must be >= 0, got {span['duration_ns']!r} for span {span.get('span_id')}")
        by_trace.setdefault(str(span["trace_id"]), []).append(span)
    out: list[ReplicaStartup] = []
    for trace_id, members in by_trace.items():
        children: dict[str, list[Mapping[str, Any]]] = {}
        for span in members:
            children.setdefault(str(span.get("parent_span_id") or ""), []).append(span)
        for root in (s for s in members if s["span_name"] == STARTUP_ROOT_SPAN):
            phases: dict[str, float] = {}
            pending = list(children.get(str(root["span_id"]), ()))
            while pending:
                span = pending.pop()
                seconds = int(span["duration_ns"]) / 1e9
                phases[span["span_name"]] = max(seconds, phases.get(span["span_name"], 0.0))
                pending.extend(children.get(str(span["span_id"]), ()))
            resource = root.get("resource_attributes") or {}
            replica = next((resource[k] for k in REPLICA_ATTRIBUTES if resource.get(k)), "")
            loading = int(root["duration_ns"]) / 1e9
            out.append(
                ReplicaStartup(
                    trace_id,
                    str(root.get("service_name", "")),
                    replica,
                    root["timestamp"],
                    root["timestamp"] + timedelta(seconds=loading),
                    loading,
                    phases,
                )
            )
    return sorted(out, key=lambda s: s.started_at)


def fetch_startups(store: Any, start: datetime, end: datetime) -> list[ReplicaStartup]:
    """Start-ups whose ``Overall Loading`` span began in ``[start, end)`` (aware datetimes),
    with every span of their traces, from ``otel_traces``."""
    # The roots first: a window without a start-up (the usual case) then costs one index
    # read of the span-name key, not a scan for trace ids over every span of the window.
    roots = store.query(
        "SELECT DISTINCT TraceId FROM otel_traces WHERE SpanName = {root:String}"
        " AND Timestamp >= {start:DateTime64(9)} AND Timestamp < {end:DateTime64(9)}",
        {"root": STARTUP_ROOT_SPAN, "start": start, "end": end},
    )
    if not roots:
        return []
    rows = store.query(
        "SELECT TraceId, SpanId, ParentSpanId, SpanName, Timestamp, Duration, ServiceName, ResourceAttributes"
        " FROM otel_traces WHERE TraceId IN {traces:Array(String)}",
        {"traces": [r[0] for r in roots]},
    )
    spans = [
        {
            "trace_id": t,
            "span_id": s,
            "parent_span_id": p,
            "span_name": n,
            "timestamp": ts,
            "duration_ns": int(d),
            "service_name": svc,
            "resource_attributes": dict(res or {}),
        }
        for t, s, p, n, ts, d, svc, res in rows
    ]
    return [s for s in startups_from_spans(spans) if start <= s.started_at < end]


class StoredStartups(Sequence[ReplicaStartup]):
    """The start-ups of :func:`fetch_startups` over ``[start, end)`` whose ``ready_at`` lies in
    ``[ready_from, ready_before)``, read from the store on first iteration (a healthy
    diagnosis never asks). Iterable and sized like the list it stands for, oldest first.

    ``warm_at``: the start of the window under diagnosis; a start-up whose replica served
    requests between its readiness and ``warm_at`` (stored request rows of that replica, or
    of any replica when the start-up names none) is left out: the replica took
    its first requests before the window, whatever baseline the caller chose (a real vLLM,
    ready a minute before a slow retriever's window and 87 requests into its warm traffic,
    was otherwise charged 31 % of the tail)."""

    def __init__(
        self,
        store: Any,
        start: datetime,
        end: datetime,
        *,
        ready_from: datetime,
        ready_before: datetime,
        warm_at: datetime | None = None,
    ) -> None:
        self.store, self.start, self.end = store, start, end
        self.ready_from, self.ready_before, self.warm_at = ready_from, ready_before, warm_at
        self._startups: list[ReplicaStartup] | None = None

    def _read(self) -> list[ReplicaStartup]:
        if self._startups is None:
            startups = [
                s
                for s in fetch_startups(self.store, self.start, self.end)
                if self.ready_from <= s.ready_at < self.ready_before
            ]
            early = [s for s in startups if self.warm_at is not None and s.ready_at < self.warm_at]
            if early:
                last_served = self._last_served(min(s.ready_at for s in early))
                latest_any = max(last_served.values(), default=None)
                for startup in early:
                    # A named replica by its own rows; an unnamed start-up (vLLM sets no
                    # instance id) by any replica's, as the cold-start rule applies it.
                    served = last_served.get(startup.replica) if startup.replica else latest_any
                    if served is not None and served >= startup.ready_at:
                        startups.remove(startup)
            self._startups = startups
        return self._startups

    def _last_served(self, since: datetime) -> dict[Any, datetime]:
        """Replica → its latest request row in ``[since, warm_at)``."""
        rows = self.store.query(
            "SELECT replica, max(timestamp) FROM inferpath_requests FINAL"
            " WHERE timestamp >= {since:DateTime64(9, 'UTC')} AND timestamp < {until:DateTime64(9, 'UTC')}"
            " GROUP BY replica",
            {"since": since, "until": self.warm_at},
        )
        return {replica: latest for replica, latest in rows}

    def __iter__(self) -> Iterator[ReplicaStartup]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    @overload
    def __getitem__(self, index: int) -> ReplicaStartup: ...

    @overload
    def __getitem__(self, index: slice) -> list[ReplicaStartup]: ...

    def __getitem__(self, index: int | slice) -> ReplicaStartup | list[ReplicaStartup]:
        return self._read()[index]


__all__ = [
    "REPLICA_ATTRIBUTES",
    "STARTUP_ROOT_SPAN",
    "ReplicaStartup",
    "StoredStartups",
    "fetch_startups",
    "startups_from_spans",
]
