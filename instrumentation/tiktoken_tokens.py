"""``tiktoken``: ``tokenize`` spans for its encoders, and a token counter that never downloads.

``tiktoken.get_encoding("cl100k_base")`` fetches the BPE file from the internet the first
time unless it is in tiktoken's cache (``TIKTOKEN_CACHE_DIR``, else ``DATA_GYM_CACHE_DIR``,
else ``<tmp>/data-gym-cache``). Inside a service without egress that fetch hangs or fails
on every request that tries it. :func:`count_tokens` loads an encoding **from the cache
only** (the fetch function is blocked while it loads), once per process and encoding:

* cache filled: the exact count; no socket is opened.
* cache empty (or no tiktoken): an estimate, ``ceil(characters / 4)`` (OpenAI's rule of
  thumb for English text), returned as ``TokenCount(estimated=True)`` and marked on the
  span (``inferpath.tokenize.estimated``); one warning per process and encoding; later
  calls reuse the verdict and never retry.

:func:`instrument_library` (the registry's ``tiktoken`` integration) wraps
``Encoding.encode`` / ``encode_ordinary`` / ``encode_batch`` / ``encode_ordinary_batch``
so each call inside a trace is one ``tokenize`` span. Wrapping never loads an encoding.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

from inferpath.instrumentation.patching import unwrap_methods, wrap_methods
from inferpath.instrumentation.tokenizers import run_traced

__all__ = [
    "TokenCount",
    "count_tokens",
    "load_cached_encoding",
    "instrument_library",
    "uninstrument_library",
    "CHARS_PER_TOKEN_ESTIMATE",
    "ATTR_ESTIMATED",
]

_logger = logging.getLogger(__name__)

#: OpenAI's rule of thumb: one token is about four characters of English text.
CHARS_PER_TOKEN_ESTIMATE = 4
ATTR_ESTIMATED = "inferpath.tokenize.estimated"

_lock = threading.Lock()
_encodings: dict[str, Any] = {}  # encoding name -> Encoding, or None once it failed to load


@dataclass(frozen=True)
class TokenCount:
    """``tokens``: the count; ``estimated``: True when it is ``ceil(chars / 4)`` because
    the encoding could not be loaded without a download."""

    tokens: int
    estimated: bool


class DownloadBlocked(OSError):
    """Raised in place of tiktoken's network fetch while an encoding loads cache-only."""


def _blocked_read_file(blobpath: str) -> bytes:
    raise DownloadBlocked(f"inferpath loads tiktoken encodings from the cache only; {blobpath} is not cached")


def load_cached_encoding(encoding_name: str) -> Any | None:
    """The ``tiktoken.Encoding`` named ``encoding_name`` if it loads from tiktoken's cache
    without any network access, else ``None`` (tiktoken absent, file not cached, unknown
    name). Tried once per process and name; the verdict is kept (no retry per request).
    One warning per name when it is not available.
    """
    if encoding_name in _encodings:
        return _encodings[encoding_name]
    with _lock:
        if encoding_name in _encodings:
            return _encodings[encoding_name]
        encoding = None
        try:
            import tiktoken
            import tiktoken.load as tiktoken_load

            original = tiktoken_load.read_file
            # read_file_cached() returns the cached bytes when present and calls read_file()
            # (the download) only on a miss: blocking read_file makes the load cache-only.
            tiktoken_load.read_file = _blocked_read_file
            try:
                encoding = tiktoken.get_encoding(encoding_name)
            finally:
                tiktoken_load.read_file = original
        except ImportError:
            _logger.warning(
                "inferpath: tiktoken is not installed; token counts for %s are estimated (characters / %d)",
                encoding_name,
                CHARS_PER_TOKEN_ESTIMATE,
            )
        except Exception as error:
            _logger.warning(
                "inferpath: tiktoken encoding %s is not in the local cache (%s); "
                "token counts are estimated (characters / %d) and no download is "
                "attempted",
                encoding_name,
                type(error).__name__,
                CHARS_PER_TOKEN_ESTIMATE,
            )
        _encodings[encoding_name] = encoding
        return encoding


def count_tokens(text: str, encoding_name: str = "cl100k_base") -> TokenCount:
    """Tokens of ``text`` under the tiktoken encoding ``encoding_name``, as one ``tokenize``
    span (``gen_ai.usage.input_tokens``, plus ``inferpath.tokenize.estimated`` when the
    encoding is not cached, see the module docstring). Never downloads, never raises for a
    missing encoding. Raises ``TypeError`` if ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text)!r}")
    encoding = load_cached_encoding(encoding_name)
    if encoding is not None:
        tokens = run_traced(
            encoding.encode, (text,), {"disallowed_special": ()}, len, attributes={ATTR_ESTIMATED: False}
        )
        return TokenCount(len(tokens), False)
    estimate = math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)
    run_traced(lambda: estimate, (), {}, lambda result: result, attributes={ATTR_ESTIMATED: True})
    return TokenCount(estimate, True)


_METHODS = ("encode", "encode_ordinary", "encode_batch", "encode_ordinary_batch")


def _traced(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return run_traced(wrapped, args, kwargs, len, require_parent=True)


def _traced_batch(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return run_traced(
        wrapped, args, kwargs, lambda result: sum(len(ids) for ids in result), batch_size=len, require_parent=True
    )


def instrument_library(**_options: Any) -> None:
    """Wrap ``tiktoken.Encoding``'s encode methods (idempotent)."""
    import tiktoken

    wrap_methods(tiktoken.Encoding, {name: _traced_batch if name.endswith("_batch") else _traced for name in _METHODS})


def uninstrument_library() -> None:
    """Restore ``tiktoken.Encoding``'s methods."""
    import tiktoken

    unwrap_methods(tiktoken.Encoding)
