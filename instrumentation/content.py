"""Privacy of prompt and completion text: off by default, on only through a redaction hook.

Spans never carry prompt or completion text unless the application opts in with
:func:`configure_content_capture`. When it does, every text passes through its ``redact``
hook first (``None`` from the hook drops that text), so secrets and personal data can be
masked before anything leaves the process. The attribute names are the OTel GenAI
conventions' ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON strings).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "configure_content_capture",
    "content_capture_enabled",
    "redacted",
    "input_messages_attribute",
    "output_messages_attribute",
    "GEN_AI_INPUT_MESSAGES",
    "GEN_AI_OUTPUT_MESSAGES",
]

_logger = logging.getLogger(__name__)

GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
# A span attribute is not a log store: longer texts are cut (after redaction).
MAX_CONTENT_CHARS = 16_384

Redactor = Callable[[str], "str | None"]


@dataclass(frozen=True)
class _Capture:
    enabled: bool = False
    redact: Redactor | None = None


_capture = _Capture()


def configure_content_capture(enabled: bool, redact: Redactor | None = None) -> None:
    """Record prompt and completion text on model-call spans (``enabled=True``) or not
    (the default). ``redact(text) -> str | None`` is applied to every text before it is
    recorded; return ``None`` to drop it. Opting in without a hook records text as is.

    Raises ``TypeError`` if ``enabled`` is not a bool or ``redact`` is not callable.
    """
    global _capture
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled)!r}")
    if redact is not None and not callable(redact):
        raise TypeError(f"redact must be callable or None, got {type(redact)!r}")
    _capture = _Capture(enabled, redact)


def content_capture_enabled() -> bool:
    """True once the application opted in to recording prompt/completion text."""
    return _capture.enabled


def redacted(text: Any) -> str | None:
    """``text`` after the redaction hook, cut to :data:`MAX_CONTENT_CHARS`; ``None`` when
    capture is off, the text is not a string, the hook dropped it, or the hook failed (a
    failing hook must never leak the raw text)."""
    capture = _capture
    if not capture.enabled or not isinstance(text, str):
        return None
    if capture.redact is not None:
        try:
            text = capture.redact(text)
        except Exception:
            _logger.warning("inferpath: the content redaction hook failed; text dropped", exc_info=True)
            return None
        if not isinstance(text, str):
            return None
    return text[:MAX_CONTENT_CHARS]


def input_messages_attribute(payload: Any) -> str | None:
    """``gen_ai.input.messages`` for an OpenAI request body (``messages`` or ``prompt``),
    each text redacted; ``None`` when capture is off or nothing is left."""
    if not _capture.enabled or not isinstance(payload, dict):
        return None
    messages: list[dict[str, Any]] = []
    raw = payload.get("messages")
    if isinstance(raw, list):
        for message in raw:
            if isinstance(message, dict):
                text = redacted(message.get("content"))
                if text is not None:
                    messages.append({"role": str(message.get("role", "user")), "content": text})
    elif isinstance(payload.get("prompt"), str):
        text = redacted(payload["prompt"])
        if text is not None:
            messages.append({"role": "user", "content": text})
    return json.dumps(messages) if messages else None


def output_messages_attribute(text: str) -> str | None:
    """``gen_ai.output.messages`` for a completion text, redacted; ``None`` when capture is
    off or the hook dropped it."""
    value = redacted(text)
    if value is None:
        return None
    return json.dumps([{"role": "assistant", "content": value}])
