"""``transformers`` integration: a ``tokenize`` span per tokenizer call.

Wraps ``PreTrainedTokenizerBase.__call__`` and ``.encode`` (the two public entry points;
every slow and fast tokenizer inherits them). The token count is read from the result
(``input_ids``: a list, a list of lists, or an array). Calls outside a trace (start-up
warm-up) are not traced. Loading a tokenizer
(``from_pretrained``) is left alone: nothing here can start a download.
"""

from __future__ import annotations

import logging
from typing import Any

from inferpath.instrumentation.patching import unwrap_methods, wrap_methods
from inferpath.instrumentation.tokenizers import run_traced

__all__ = ["instrument_library", "uninstrument_library", "count_input_ids"]

_logger = logging.getLogger(__name__)
_METHODS = ("__call__", "encode")


def count_input_ids(result: Any) -> int:
    """Tokens in a tokenizer result: ``encode``'s list of ids, or ``__call__``'s
    ``BatchEncoding`` whose ``input_ids`` is a list of ids, a list of such lists, or an
    array (its element count). Raises ``TypeError`` for anything else."""
    ids = result.get("input_ids") if hasattr(result, "get") and not isinstance(result, list) else result
    if hasattr(ids, "numel"):  # torch tensor
        return int(ids.numel())
    if hasattr(ids, "size") and not isinstance(ids, list):  # numpy array
        return int(ids.size)
    if isinstance(ids, list):
        if ids and isinstance(ids[0], (list, tuple)):
            return sum(len(row) for row in ids)
        return len(ids)
    raise TypeError(f"no input_ids in a {type(result)!r}")


def _traced(wrapped: Any, _instance: Any, args: tuple, kwargs: dict) -> Any:
    return run_traced(
        wrapped,
        args,
        kwargs,
        count_input_ids,
        attributes={"inferpath.tokenize.library": "transformers"},
        require_parent=True,
    )


def instrument_library(**_options: Any) -> None:
    """Wrap ``transformers``' tokenizer entry points (idempotent)."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase as cls

    wrap_methods(cls, dict.fromkeys(_METHODS, _traced))


def uninstrument_library() -> None:
    """Restore the original methods."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase as cls

    unwrap_methods(cls)
