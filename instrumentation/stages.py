"""``stage()``: mark a piece of work as one stage of the inference path.

    with inferpath.stage("retrieval") as span:       # sync or ``async with``
        span.set_attribute("inferpath.retrieval.documents", len(docs))

    @inferpath.stage("tokenize")                     # sync or async functions
    def encode(text): ...

Each entry opens one INTERNAL span named after the stage with ``inferpath.stage=<name>``
(docs/telemetry-contract.md), child of the current span. An exception from the wrapped code
is recorded on the span (status ERROR) and re-raised unchanged; a failure of the telemetry
itself is logged and swallowed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode

from inferpath.instrumentation import provider
from inferpath.instrumentation.semconv import ERROR_TYPE, STAGE, coerce_attributes
from inferpath.vocabulary import STAGES

__all__ = ["stage", "Stage", "STAGES"]

_logger = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_INVALID_SPAN = NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
# Open ``with`` entries of this task/thread: a module-level marker such as
# ``RETRIEVAL = stage("retrieval")`` may be entered by many concurrent requests, and each
# must close its own span, so the bookkeeping lives in the context, not on the marker.
_open_entries: contextvars.ContextVar[tuple[tuple[Stage, Span, object | None], ...]] = contextvars.ContextVar(
    "inferpath_open_stages", default=()
)


class Stage:
    """A reusable stage marker; each ``with``/call opens a fresh span. Build it with
    :func:`stage`."""

    __slots__ = ("name", "attributes")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        # Coerced once here, where user values enter: NumPy scalars (np.float32(0.7)) would
        # be refused by the SDK with an "Invalid type" warning on every span.
        self.attributes = {STAGE: name, **coerce_attributes(attributes)}

    # -- span lifecycle, every step guarded ------------------------------------------
    def _start(self) -> tuple[Span, object | None]:
        try:
            span = provider.get_tracer().start_span(self.name, kind=SpanKind.INTERNAL, attributes=self.attributes)
            token = otel_context.attach(trace.set_span_in_context(span))
            return span, token
        except Exception:
            _logger.warning("inferpath: could not start stage span %r", self.name, exc_info=True)
            return _INVALID_SPAN, None

    @staticmethod
    def _end(span: Span, token: Any, error: BaseException | None) -> None:
        try:
            if token is not None:
                otel_context.detach(token)
            if error is not None and isinstance(error, Exception):
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                span.set_attribute(ERROR_TYPE, type(error).__qualname__)
            span.end()
        except Exception:
            _logger.warning("inferpath: could not end a stage span", exc_info=True)

    # -- context manager (sync and async) --------------------------------------------
    def __enter__(self) -> Span:
        span, token = self._start()
        _open_entries.set(_open_entries.get() + ((self, span, token),))
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        entries = _open_entries.get()
        for index in range(len(entries) - 1, -1, -1):
            if entries[index][0] is self:
                _, span, token = entries[index]
                _open_entries.set(entries[:index] + entries[index + 1 :])
                self._end(span, token, exc)
                break
        return None  # never swallow the caller's exception

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        return self.__exit__(exc_type, exc, tb)

    # -- decorator ---------------------------------------------------------------------
    def __call__(self, func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                span, token = self._start()
                try:
                    result = await func(*args, **kwargs)
                except BaseException as error:
                    self._end(span, token, error)
                    raise
                self._end(span, token, None)
                return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            span, token = self._start()
            try:
                result = func(*args, **kwargs)
            except BaseException as error:
                self._end(span, token, error)
                raise
            self._end(span, token, None)
            return result

        return wrapper  # type: ignore[return-value]


def stage(name: str, **attributes: Any) -> Stage:
    """A stage marker usable as ``with``, ``async with`` and as a decorator of sync and
    async functions.

    ``name`` is one of :data:`STAGES` (``gateway``, ``tokenize``, ``retrieval``, ``queue``,
    ``prefill``, ``decode``, ``model``, ``network``, ``postprocess``, ``other``).
    ``attributes`` become span attributes (dotted names via ``**{"a.b": 1}``); NumPy scalars
    and arrays become Python values, ``None`` values are left out, other objects become
    their ``str()`` (:func:`~inferpath.instrumentation.semconv.attribute_value`). Entering
    yields the span, so more attributes can be set inside.

    Raises ``ValueError`` (at the call site, a setup error) for an unknown stage name.
    """
    if name not in STAGES:
        raise ValueError(f"stage name must be one of {', '.join(STAGES)}; got {name!r}")
    return Stage(name, attributes)
