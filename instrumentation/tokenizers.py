"""Hugging Face ``tokenizers`` integration: a ``tokenize`` stage span per encode call.

Two ways in: :func:`instrument_tokenizer` wraps one ``tokenizers.Tokenizer`` instance (its
methods cannot be set on an instance of the Rust type), and :func:`instrument_library` (the
registry's ``tokenizers`` integration) wraps the methods on the class, which the installed
releases allow. Both go through :func:`run_traced`, whose re-entrancy guard makes one span
per user call even when ``transformers`` calls the Rust tokenizer underneath. Nothing here
loads a tokenizer, so nothing here can trigger a download.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from inferpath.instrumentation import provider
from inferpath.instrumentation import semconv as sc
from inferpath.instrumentation.patching import unwrap_methods, wrap_methods

__all__ = ["instrument_tokenizer", "InstrumentedTokenizer", "run_traced", "instrument_library", "uninstrument_library"]

_logger = logging.getLogger(__name__)
# True while a tokenize span of this task/thread is open: libraries call their own
# encode methods from one another, and one user call must make one span.
_in_tokenize: contextvars.ContextVar[bool] = contextvars.ContextVar("inferpath_in_tokenize", default=False)


class InstrumentedTokenizer:
    """Wraps a ``tokenizers.Tokenizer`` (or anything with ``encode``/``encode_batch``
    returning objects with ``ids``). Each call opens an INTERNAL ``tokenize`` span with
    ``inferpath.stage=tokenize`` and ``gen_ai.usage.input_tokens`` (ids produced, summed
    over a batch). Errors of the tokenizer are recorded and re-raised unchanged."""

    __slots__ = ("wrapped",)

    def __init__(self, tokenizer: Any) -> None:
        object.__setattr__(self, "wrapped", tokenizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        """``Tokenizer.encode`` traced; returns its ``Encoding`` unchanged."""
        return self._traced(self.wrapped.encode, args, kwargs, batch=False)

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        """``Tokenizer.encode_batch`` traced; returns its list of ``Encoding`` unchanged."""
        return self._traced(self.wrapped.encode_batch, args, kwargs, batch=True)

    @staticmethod
    def _traced(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, batch: bool) -> Any:
        if batch:
            return run_traced(
                method,
                args,
                kwargs,
                lambda result: sum(len(encoding.ids) for encoding in result),
                batch_size=lambda result: len(result),
            )
        return run_traced(method, args, kwargs, lambda result: len(result.ids))


def run_traced(
    method: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    count_tokens: Callable[[Any], int],
    batch_size: Callable[[Any], int] | None = None,
    attributes: dict[str, Any] | None = None,
    require_parent: bool = False,
) -> Any:
    """Call ``method(*args, **kwargs)`` inside one INTERNAL ``tokenize`` span.

    ``count_tokens(result)`` gives ``gen_ai.usage.input_tokens``; ``batch_size(result)``,
    if given, ``inferpath.tokenize.batch_size``. A call made while another tokenize span
    of this context is open (``encode`` calling ``__call__`` inside a library) is not
    traced again. Errors of ``method`` are recorded and re-raised unchanged; telemetry
    errors are logged and swallowed. Shared by every tokenizer integration.

    ``require_parent``: trace only inside a trace (a request). Library-wide integrations
    set it: tokenizing at start-up is not a stage of any request, and worker threads of a
    library's own batch pool (tiktoken's ``encode_batch``) must not become root spans.
    """
    if _in_tokenize.get() or (require_parent and not trace.get_current_span().get_span_context().is_valid):
        return method(*args, **kwargs)
    try:
        span = provider.get_tracer().start_span(
            "tokenize", kind=SpanKind.INTERNAL, attributes={sc.STAGE: "tokenize", **(attributes or {})}
        )
    except Exception:
        _logger.warning("inferpath: could not start a tokenize span", exc_info=True)
        return method(*args, **kwargs)
    marker = _in_tokenize.set(True)
    try:
        result = method(*args, **kwargs)
    except Exception as error:
        try:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
            span.end()
        except Exception:  # pragma: no cover - SDK failure
            pass
        raise
    finally:
        _in_tokenize.reset(marker)
    try:
        span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, int(count_tokens(result)))
        if batch_size is not None:
            span.set_attribute("inferpath.tokenize.batch_size", int(batch_size(result)))
    except Exception:
        _logger.debug("inferpath: token count of a tokenizer result not readable", exc_info=True)
    try:
        span.end()
    except Exception:
        _logger.warning("inferpath: could not end a tokenize span", exc_info=True)
    return result


def instrument_tokenizer(tokenizer: Any) -> InstrumentedTokenizer:
    """Return ``tokenizer`` wrapped so that ``encode``/``encode_batch`` are traced
    (idempotent: an already wrapped tokenizer is returned as is).

    Raises ``TypeError`` if ``tokenizer`` has no ``encode`` method.
    """
    if isinstance(tokenizer, InstrumentedTokenizer):
        return tokenizer
    if not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must have an encode() method, got {type(tokenizer)!r}")
    return InstrumentedTokenizer(tokenizer)


_PATCHED_METHODS = ("encode", "encode_batch", "encode_batch_fast")


def _traced(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return run_traced(wrapped, args, kwargs, lambda result: len(result.ids), require_parent=True)


def _traced_batch(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return run_traced(
        wrapped,
        args,
        kwargs,
        lambda result: sum(len(encoding.ids) for encoding in result),
        batch_size=len,
        require_parent=True,
    )


def instrument_library(**_options: Any) -> None:
    """Trace ``tokenizers.Tokenizer.encode`` / ``encode_batch`` (/ ``encode_batch_fast``)
    of every tokenizer, existing or future (idempotent).

    Raises ``TypeError`` where the installed release makes the type immutable (the
    registry logs it and skips; :func:`instrument_tokenizer` still works there).
    """
    import tokenizers

    wrap_methods(
        tokenizers.Tokenizer,
        {name: _traced if name == "encode" else _traced_batch for name in _PATCHED_METHODS},
        inherited=True,
    )


def uninstrument_library() -> None:
    """Restore the original ``tokenizers.Tokenizer`` methods."""
    import tokenizers

    unwrap_methods(tokenizers.Tokenizer)
