"""Hugging Face ``tokenizers`` integration: a ``tokenize`` stage span per encode call.

``tokenizers.Tokenizer`` is a Rust extension type whose methods cannot be patched on an
instance, so :func:`instrument_tokenizer` returns a thin wrapper that traces ``encode`` /
``encode_batch`` and forwards everything else unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from inferpath.instrumentation import provider
from inferpath.instrumentation import semconv as sc

__all__ = ["instrument_tokenizer", "InstrumentedTokenizer"]

_logger = logging.getLogger(__name__)


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
        try:
            span = provider.get_tracer().start_span(
                "tokenize", kind=SpanKind.INTERNAL, attributes={sc.STAGE: "tokenize"})
        except Exception:
            _logger.warning("inferpath: could not start a tokenize span", exc_info=True)
            return method(*args, **kwargs)
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
        try:
            encodings = result if batch else (result,)
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS,
                               sum(len(encoding.ids) for encoding in encodings))
            if batch:
                span.set_attribute("inferpath.tokenize.batch_size", len(result))
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
