"""The gateway's SERVER span, recorded without the SDK's per-span machinery.

The OTel SDK's ``Span`` allocates on every start two locks, a validating attribute map,
bounded event and link lists, and copies itself into a ``ReadableSpan`` at the end; in a
FastAPI request that is about 30 µs on the project's 2-core machine, most of what the
gateway integration costs (``bench/bench_gateway.py``). :class:`LeanServerSpan` keeps the
span's state in plain fields while the request runs and builds the SDK's ``ReadableSpan``
once, at the end, validated by the SDK's own ``BoundedAttributes``/``BoundedList`` with the
provider's span limits, then hands it to the provider's span processor. What the exporter
receives is what the SDK would have built: same ids, sampling decision and flags, parent,
trace state, resource, scope, attributes (cleaned and limited), events, links, status.

It is used only where that equivalence is known to hold (:func:`lean_parts`): an SDK
``Tracer`` whose processors are all ``BatchSpanProcessor`` (their ``on_start`` does
nothing, so skipping it changes nothing), tracer enabled, no SDK self-metrics. Anything
else (an application's own processors, another SDK version's internals) gets the SDK span.

The span is used from the request's own task; attribute writes from other threads are
safe under the GIL (dict stores), as for any plain Python object.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = ["LeanServerSpan", "lean_parts", "start_server_span"]

_logger = logging.getLogger(__name__)
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


class _Parts:
    """What a lean span needs from one SDK tracer, read once per tracer."""

    __slots__ = ("tracer", "sampler", "id_generator", "processor", "resource", "limits",
                 "scope", "info")

    def __init__(self, tracer: SdkTracer) -> None:
        self.tracer = tracer
        self.sampler = tracer.sampler
        self.id_generator = tracer.id_generator
        self.processor = tracer.span_processor
        self.resource = tracer.resource
        self.limits = tracer._span_limits
        self.scope = tracer._instrumentation_scope
        self.info = tracer.instrumentation_info


_parts_by_tracer: dict[int, tuple[Any, _Parts | None]] = {}


def lean_parts(tracer: Any) -> _Parts | None:
    """The parts of ``tracer`` a lean span needs, or ``None`` when it must get SDK spans
    (not an SDK tracer, disabled, SDK self-metrics on, a processor other than
    ``BatchSpanProcessor``, or internals this SDK version does not have). The processor
    list is checked on every call (processors may be added at any time); the rest is
    cached per tracer."""
    entry = _parts_by_tracer.get(id(tracer))
    if entry is None or entry[0] is not tracer:
        parts = None
        try:
            if (type(tracer) is SdkTracer and tracer._is_enabled()
                    and type(tracer._tracer_metrics) is NoOpTracerMetrics):
                parts = _Parts(tracer)
        except Exception:  # pragma: no cover - another SDK version's internals
            parts = None
        if len(_parts_by_tracer) > 64:
            _parts_by_tracer.clear()
        entry = _parts_by_tracer[id(tracer)] = (tracer, parts)
    parts = entry[1]
    if parts is None:
        return None
    processor = parts.processor
    if type(processor) is not SynchronousMultiSpanProcessor:
        return None
    for inner in processor._span_processors:
        if type(inner) is not BatchSpanProcessor:
            return None
    return parts


def start_server_span(tracer: Any, name: str, context: Context | None,
                      attributes: Mapping[str, Any], start_time_ns: int) -> trace.Span:
    """Start a SERVER span as ``tracer.start_span(name, context, kind=SERVER,
    attributes, start_time=start_time_ns)`` would: lean where :func:`lean_parts` allows,
    the SDK's span otherwise. ``start_time_ns`` is wall-clock nanoseconds. A sampler
    that drops the span gives a ``NonRecordingSpan`` carrying the new ids, as the SDK does."""
    parts = lean_parts(tracer)
    if parts is None:
        return tracer.start_span(name, context=context, kind=SpanKind.SERVER,
                                 attributes=attributes, start_time=start_time_ns)
    # Same steps, same order, as the SDK's Tracer.start_span (opentelemetry-sdk 1.45).
    parent = trace.get_current_span(context).get_span_context()
    if parent is None or not parent.is_valid:
        parent = None
        trace_id = parts.id_generator.generate_trace_id()
    else:
        trace_id = parent.trace_id
    sampling = parts.sampler.should_sample(context, trace_id, name, SpanKind.SERVER,
                                           attributes, ())
    flags = _SAMPLED if sampling.decision.is_sampled() else _NOT_SAMPLED
    if parent is None:
        random_trace_id = parts.id_generator.is_trace_id_random()
    else:
        random_trace_id = parent.trace_flags.random_trace_id
    if random_trace_id:
        flags = TraceFlags(flags | TraceFlags.RANDOM_TRACE_ID)
    span_context = SpanContext(trace_id, parts.id_generator.generate_span_id(),
                               is_remote=False, trace_flags=flags,
                               trace_state=sampling.trace_state)
    if not sampling.decision.is_recording():
        return trace.NonRecordingSpan(span_context)
    return LeanServerSpan(parts, name, span_context, parent, sampling.attributes, start_time_ns)


_PLAIN_VALUE_TYPES = frozenset({str, int, float, bool, bytes})


def _validated(attributes: dict[str, Any], max_count: int | None,
               max_value_length: int | None) -> Mapping[str, Any]:
    """The span's attributes as the SDK would store them.

    The common case (non-empty string keys, plain scalar values, within the count limit,
    no length limit) is exactly what the SDK's cleaning leaves unchanged, so the dict itself
    is returned (an ended span never writes to it again); anything else goes through the
    SDK's ``BoundedAttributes`` (its cleaning, truncation, limits and drop count)."""
    if max_value_length is None and (max_count is None or len(attributes) <= max_count):
        for key, value in attributes.items():
            if type(value) not in _PLAIN_VALUE_TYPES or type(key) is not str or not key:
                break
        else:
            return attributes
    return BoundedAttributes(max_count, attributes, immutable=True,
                             max_value_len=max_value_length)


class LeanServerSpan(trace.Span):
    """A recording SERVER span whose SDK ``ReadableSpan`` is built once, at :meth:`end`.

    Implements the whole ``opentelemetry.trace.Span`` API, with the SDK span's rules:
    calls after the end are ignored with a warning, ``set_status`` ignores UNSET and any
    change after OK, exceptions are recorded as ``exception`` events with the same
    attributes. Attribute values are validated (and limited) when the span ends.
    """

    __slots__ = ("_parts", "_name", "_context", "_parent", "_attributes", "_events",
                 "_links", "_status", "_start_time", "_end_time")

    def __init__(self, parts: _Parts, name: str, context: SpanContext,
                 parent: SpanContext | None, attributes: Mapping[str, Any] | None,
                 start_time_ns: int) -> None:
        self._parts = parts
        self._name = name
        self._context = context
        self._parent = parent
        self._attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self._events: list[Event] | None = None
        self._links: list[Link] | None = None
        self._status = _UNSET
        self._start_time = start_time_ns
        self._end_time: int | None = None

    # -- the Span API --------------------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def _ended(self, operation: str) -> bool:
        if self._end_time is None:
            return False
        _logger.warning("Tried calling %s on an ended span.", operation)
        return True

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if not self._ended("set_attributes"):
            self._attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        if not self._ended("set_attribute"):
            self._attributes[key] = value

    def update_name(self, name: str) -> None:
        if not self._ended("update_name"):
            self._name = name

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        if self._ended("add_event"):
            return
        limits = self._parts.limits
        event = Event(name=name, timestamp=timestamp, attributes=BoundedAttributes(
            limits.max_event_attributes, attributes,
            max_value_len=limits.max_attribute_length, immutable=True))
        if self._events is None:
            self._events = []
        self._events.append(event)

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self._ended("add_link"):
            return
        if context is None or not (context.is_valid or attributes or context.trace_state):
            return  # the SDK's _is_valid_link rule
        limits = self._parts.limits
        link = Link(context, BoundedAttributes(limits.max_link_attributes, attributes,
                                               max_value_len=limits.max_attribute_length,
                                               immutable=True))
        if self._links is None:
            self._links = []
        self._links.append(link)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._ended("set_status"):
            return
        if self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is StatusCode.UNSET:
                return
            if description is not None:
                _logger.warning("Description %s ignored. Use either `Status` or "
                                "`(StatusCode, Description)`", description)
            self._status = status
        elif isinstance(status, StatusCode) and status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(self, exception: BaseException,
                         attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        recorded: dict[str, Any] = {
            "exception.type": (f"{module}.{qualname}" if module and module != "builtins"
                               else qualname),
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            _logger.warning("Calling end() on an ended span.")
            return
        self._end_time = end_time if end_time is not None else time.time_ns()
        parts = self._parts
        limits = parts.limits
        attributes = _validated(self._attributes, limits.max_span_attributes,
                                limits.max_span_attribute_length)
        events: Sequence[Event] = BoundedList(limits.max_events)
        if self._events:
            events.extend(self._events)
        links: Sequence[Link] = BoundedList(limits.max_links)
        if self._links:
            links.extend(self._links)
        parts.processor.on_end(ReadableSpan(
            name=self._name, context=self._context, parent=self._parent,
            resource=parts.resource, attributes=attributes, events=events, links=links,
            kind=SpanKind.SERVER, status=self._status, start_time=self._start_time,
            end_time=self._end_time, instrumentation_info=parts.info,
            instrumentation_scope=parts.scope))

    # -- read access, as on the SDK's span, for code that inspects the current span ------

    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> SpanKind:
        return SpanKind.SERVER

    @property
    def attributes(self) -> Mapping[str, Any]:
        return dict(self._attributes)

    @property
    def parent(self) -> SpanContext | None:
        return self._parent

    @property
    def start_time(self) -> int:
        return self._start_time

    @property
    def end_time(self) -> int | None:
        return self._end_time

    def __repr__(self) -> str:
        return f'{type(self).__name__}(name="{self._name}", context={self._context})'
