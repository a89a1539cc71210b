"""``qdrant-client`` integration: each vector search as one ``retrieval`` stage span.

Wraps the read methods of ``QdrantClient`` and ``AsyncQdrantClient`` (``query_points``,
``query_batch_points``, ``query_points_groups``, ``retrieve``, ``scroll`` and, on releases
that still have them, ``search`` / ``search_batch``). One INTERNAL span ``retrieval`` per
call, child of the current span, with ``inferpath.stage=retrieval``,
``inferpath.retrieval.documents`` (points returned), and the OTel database conventions
``db.system.name=qdrant``, ``db.operation.name`` (the method) and ``db.collection.name``.
Works the same for a remote server and for the in-process ``QdrantClient(":memory:")``.
A call inside an open ``inferpath.stage("retrieval")`` adds no second span.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from inferpath.instrumentation import provider
from inferpath.instrumentation import semconv as sc
from inferpath.instrumentation.patching import unwrap_methods, wrap_methods

__all__ = ["instrument_library", "uninstrument_library", "documents_returned"]

_logger = logging.getLogger(__name__)
_METHODS = ("query_points", "query_batch_points", "query_points_groups", "retrieve", "scroll", "search", "search_batch")
DB_SYSTEM_NAME = "db.system.name"
DB_OPERATION_NAME = "db.operation.name"
DB_COLLECTION_NAME = "db.collection.name"


def documents_returned(result: Any) -> int:
    """Points in a qdrant result: ``QueryResponse.points``, a list of points, a list of
    responses (batch), ``GroupsResult.groups`` (their hits), or ``scroll``'s
    ``(points, next_offset)``. Raises ``TypeError`` for anything else."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list):
        return len(result[0])  # scroll
    points = getattr(result, "points", None)
    if isinstance(points, list):
        return len(points)
    groups = getattr(result, "groups", None)
    if isinstance(groups, list):
        return sum(len(getattr(group, "hits", ()) or ()) for group in groups)
    if isinstance(result, list):
        return sum(
            documents_returned(item) if hasattr(item, "points") or isinstance(item, list) else 1 for item in result
        )
    raise TypeError(f"not a qdrant result: {type(result)!r}")


def _in_retrieval_stage() -> bool:
    span = trace.get_current_span()
    attributes = getattr(span, "attributes", None)
    return (
        bool(attributes) and attributes is not None and attributes.get(sc.STAGE) == "retrieval" and span.is_recording()
    )


def _start(method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    collection = kwargs.get("collection_name", args[0] if args else None)
    attributes: dict[str, Any] = {sc.STAGE: "retrieval", DB_SYSTEM_NAME: "qdrant", DB_OPERATION_NAME: method_name}
    if isinstance(collection, str):
        attributes[DB_COLLECTION_NAME] = collection
    span = provider.get_tracer().start_span("retrieval", kind=SpanKind.INTERNAL, attributes=attributes)
    token = otel_context.attach(trace.set_span_in_context(span))
    return span, token


def _end(span: Any, token: Any, result: Any, error: BaseException | None) -> None:
    try:
        otel_context.detach(token)
        if error is not None:
            if isinstance(error, Exception):
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
        else:
            try:
                span.set_attribute(sc.RETRIEVAL_DOCUMENTS, documents_returned(result))
            except TypeError:
                pass
        span.end()
    except Exception:
        _logger.warning("inferpath: could not end a retrieval span", exc_info=True)


def _traced(name: str, is_async: bool) -> Any:
    """The wrapt wrapper of read method ``name`` (a coroutine function when ``is_async``)."""
    if is_async:

        async def async_method(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
            if _in_retrieval_stage():
                return await wrapped(*args, **kwargs)
            try:
                span, token = _start(name, args, kwargs)
            except Exception:
                _logger.warning("inferpath: could not start a retrieval span", exc_info=True)
                return await wrapped(*args, **kwargs)
            try:
                result = await wrapped(*args, **kwargs)
            except BaseException as error:
                _end(span, token, None, error)
                raise
            _end(span, token, result, None)
            return result

        return async_method

    def method(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
        if _in_retrieval_stage():
            return wrapped(*args, **kwargs)
        try:
            span, token = _start(name, args, kwargs)
        except Exception:
            _logger.warning("inferpath: could not start a retrieval span", exc_info=True)
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as error:
            _end(span, token, None, error)
            raise
        _end(span, token, result, None)
        return result

    return method


def _classes() -> tuple[type, ...]:
    from qdrant_client import AsyncQdrantClient, QdrantClient

    return QdrantClient, AsyncQdrantClient


def instrument_library(**_options: Any) -> None:
    """Wrap the read methods of ``QdrantClient`` and ``AsyncQdrantClient`` (idempotent)."""
    for cls in _classes():
        wrap_methods(
            cls,
            {
                name: _traced(name, inspect.iscoroutinefunction(cls.__dict__[name]))
                for name in _METHODS
                if name in cls.__dict__
            },
        )


def uninstrument_library() -> None:
    """Restore the original methods."""
    for cls in _classes():
        unwrap_methods(cls)
