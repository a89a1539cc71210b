"""TTFT / ITL accounting for streamed (SSE) LLM responses.

Definitions (NVIDIA AIPerf's, so numbers compare with its reports):

* TTFT: request start → the first chunk that carries a visible token: non-empty content,
  text, tool-call or reasoning delta. Role-only, empty and usage-only chunks do not count.
* E2E: request start → end of the response (the last chunk, or :meth:`TokenTimeline.finish`).
  A span that covers the stream has exactly this duration.
* ITL (mean): (last token − TTFT) / (output tokens − 1), defined for ≥ 2 output tokens.
  That is AIPerf's (E2E − TTFT) / (OSL − 1) with E2E taken at the last token, as the
  inferpath design defines it, so trailing finish/usage/``[DONE]`` chunks do not inflate it.
  Output tokens come from the server's ``usage.completion_tokens`` when it reports them,
  else from the count of visible-token chunk choices.

Clock: every interval here is monotonic (``time.perf_counter_ns``), converted to seconds
once, in the properties below.
"""

from __future__ import annotations

import codecs
import json
import time
from typing import Any, Iterable

__all__ = [
    "TokenTimeline",
    "SSEParser",
    "ChatStreamMeter",
    "visible_token_count",
    "usage_tokens",
    "DONE_SENTINEL",
]

DONE_SENTINEL = "[DONE]"
_NS_PER_SECOND = 1_000_000_000


class TokenTimeline:
    """Receipt times of the chunks of one streamed response, on the monotonic clock.

    ``start_ns`` defaults to ``time.perf_counter_ns()`` at construction; pass the moment the
    request was sent if it was taken earlier. Call :meth:`observe` once per received chunk
    (passing ``at_ns`` taken right at receipt keeps parse time out of the measures) and
    :meth:`finish` at the end of the stream.
    """

    __slots__ = ("start_ns", "end_ns", "last_chunk_ns", "chunks", "_token_ns",
                 "_visible_tokens", "usage_output_tokens", "usage_input_tokens")

    def __init__(self, start_ns: int | None = None) -> None:
        self.start_ns: int = time.perf_counter_ns() if start_ns is None else start_ns
        self.end_ns: int | None = None
        self.last_chunk_ns: int | None = None
        self.chunks = 0
        self._token_ns: list[int] = []
        self._visible_tokens = 0
        self.usage_output_tokens: int | None = None
        self.usage_input_tokens: int | None = None

    def observe(self, has_visible_token: bool, tokens: int = 1, *, at_ns: int | None = None) -> None:
        """Record one chunk received at ``at_ns`` (perf_counter ns; default now).

        ``has_visible_token`` says whether it carries a visible token (see
        :func:`visible_token_count`); ``tokens`` is how many it carries (≥ 1 when visible).
        """
        now_ns = time.perf_counter_ns() if at_ns is None else at_ns
        self.last_chunk_ns = now_ns
        self.chunks += 1
        if has_visible_token and tokens > 0:
            self._token_ns.append(now_ns)
            self._visible_tokens += tokens

    def set_usage(self, output_tokens: int | None = None, input_tokens: int | None = None) -> None:
        """Record the server-reported token counts (``usage.completion_tokens`` /
        ``usage.prompt_tokens``); the output count then wins over the chunk count."""
        if output_tokens is not None:
            self.usage_output_tokens = output_tokens
        if input_tokens is not None:
            self.usage_input_tokens = input_tokens

    def finish(self, at_ns: int | None = None) -> None:
        """Mark the end of the response at ``at_ns`` (perf_counter ns; default now).
        Only the first call counts."""
        if self.end_ns is None:
            self.end_ns = time.perf_counter_ns() if at_ns is None else at_ns

    @property
    def finished(self) -> bool:
        return self.end_ns is not None

    @property
    def output_tokens(self) -> int:
        """Output tokens: ``usage.completion_tokens`` if reported, else visible tokens seen."""
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return self._visible_tokens

    @property
    def visible_chunks(self) -> int:
        """Chunks that carried at least one visible token."""
        return len(self._token_ns)

    @property
    def first_token_ns(self) -> int | None:
        return self._token_ns[0] if self._token_ns else None

    @property
    def ttft_seconds(self) -> float | None:
        """Start → first visible token, seconds; ``None`` if no visible token arrived."""
        if not self._token_ns:
            return None
        return (self._token_ns[0] - self.start_ns) / _NS_PER_SECOND

    @property
    def last_token_seconds(self) -> float | None:
        """Start → last visible token, seconds; ``None`` if no visible token arrived."""
        if not self._token_ns:
            return None
        return (self._token_ns[-1] - self.start_ns) / _NS_PER_SECOND

    @property
    def e2e_seconds(self) -> float | None:
        """Start → end of the response (``finish`` time, else the last chunk), seconds."""
        end_ns = self.end_ns if self.end_ns is not None else self.last_chunk_ns
        if end_ns is None:
            return None
        return (end_ns - self.start_ns) / _NS_PER_SECOND

    @property
    def itl_seconds(self) -> float | None:
        """Mean inter-token latency, (last token − TTFT) / (output tokens − 1), seconds;
        ``None`` below 2 output tokens (AIPerf's definition, see the module docstring)."""
        tokens = self.output_tokens
        if tokens < 2 or not self._token_ns:
            return None
        return (self._token_ns[-1] - self._token_ns[0]) / _NS_PER_SECOND / (tokens - 1)

    @property
    def itl_list_seconds(self) -> list[float]:
        """Gaps between consecutive visible-token chunks, seconds (len = visible chunks − 1)."""
        stamps = self._token_ns
        return [(b - a) / _NS_PER_SECOND for a, b in zip(stamps, stamps[1:])]


class SSEParser:
    """Incremental parser of a ``text/event-stream`` body (WHATWG HTML, server-sent events).

    :meth:`feed` takes the bytes of one network read, in whatever pieces TCP delivered
    them, and returns the ``data`` payloads of the events completed by it: multi-line
    ``data`` fields are joined with ``\\n``, comments (``:``) and other fields are skipped,
    lines may end in ``\\r\\n``, ``\\n`` or ``\\r``, and UTF-8 characters split across reads
    are reassembled. The OpenAI end marker ``data: [DONE]`` is not returned; it sets
    :attr:`done`.
    """

    __slots__ = ("_decoder", "_buffer", "_data_lines", "_pending_cr", "done")

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data_lines: list[str] | None = None
        self._pending_cr = False
        self.done = False

    def feed(self, data: bytes | str) -> list[str]:
        """Parse one piece of the body; returns the completed events' data payloads."""
        text = self._decoder.decode(data) if isinstance(data, (bytes, bytearray)) else data
        if not text:
            return []
        if self._pending_cr and text.startswith("\n"):
            # The \r\n line end was split between two reads; the \r already ended the line.
            text = text[1:]
        self._pending_cr = False
        buffer = self._buffer + text
        payloads: list[str] = []
        start = 0
        length = len(buffer)
        while start < length:
            cr = buffer.find("\r", start)
            lf = buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            if cr == -1 or (lf != -1 and lf < cr):
                end, next_start = lf, lf + 1
            else:
                end = cr
                if cr + 1 < length:
                    next_start = cr + 2 if buffer[cr + 1] == "\n" else cr + 1
                else:
                    next_start = cr + 1
                    self._pending_cr = True
            self._line(buffer[start:end], payloads)
            start = next_start
        self._buffer = buffer[start:]
        return payloads

    def close(self) -> list[str]:
        """End of body: returns the payload of an event left without its blank line.

        The SSE standard discards such an event; servers that omit the final blank line
        exist, so it is returned rather than lost.
        """
        payloads: list[str] = []
        tail = self._buffer + self._decoder.decode(b"", final=True)
        self._buffer = ""
        if tail:
            self._line(tail, payloads)
        self._line("", payloads)
        return payloads

    def _line(self, line: str, payloads: list[str]) -> None:
        if not line:
            lines = self._data_lines
            if lines is not None:
                self._data_lines = None
                payload = "\n".join(lines)
                if payload.strip() == DONE_SENTINEL:
                    self.done = True
                else:
                    payloads.append(payload)
            return
        if line[0] == ":":
            return
        name, sep, value = line.partition(":")
        if name != "data":
            return
        if sep and value.startswith(" "):
            value = value[1:]
        if self._data_lines is None:
            self._data_lines = [value]
        else:
            self._data_lines.append(value)


def _non_empty(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, (str, list, dict)):
        return len(value) > 0
    return True


def visible_token_count(chunk: dict[str, Any]) -> int:
    """Number of choices of an OpenAI ``chat.completion.chunk`` or ``text_completion``
    chunk that carry a visible token: non-empty ``delta.content``, ``text``,
    ``delta.tool_calls``, ``delta.reasoning_content`` or ``delta.reasoning``.

    Role-only, empty (e.g. just ``finish_reason``) and usage-only chunks give 0, as in
    AIPerf's TTFT. Anything that is not a dict of that shape gives 0, never an error.
    """
    if not isinstance(chunk, dict):
        return 0
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return 0
    count = 0
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if _non_empty(choice.get("text")):
            count += 1
            continue
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            continue
        if (_non_empty(delta.get("content")) or _non_empty(delta.get("tool_calls"))
                or _non_empty(delta.get("reasoning_content"))
                or _non_empty(delta.get("reasoning"))):
            count += 1
    return count


def usage_tokens(chunk: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(usage.completion_tokens, usage.prompt_tokens)`` of a chunk, ``None`` where absent
    or not a non-negative int."""
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return None, None

    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    return count("completion_tokens"), count("prompt_tokens")


class ChatStreamMeter:
    """SSE parser + token timeline for one OpenAI-style stream, fed raw body bytes.

    Shared by the gateway middleware (bytes it sends) and the model client (bytes it
    receives). Payloads that are not JSON objects are counted in
    ``unparsed_payloads`` and skipped; they never raise.
    """

    __slots__ = ("parser", "timeline", "data_events", "unparsed_payloads", "chat_chunks",
                 "response_model", "finish_reasons")

    def __init__(self, start_ns: int | None = None) -> None:
        self.parser = SSEParser()
        self.timeline = TokenTimeline(start_ns)
        self.data_events = 0
        self.unparsed_payloads = 0
        self.chat_chunks = 0  # payloads shaped like OpenAI chunks (``choices`` or ``usage``)
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []

    def feed(self, data: bytes, at_ns: int) -> list[dict[str, Any]]:
        """Parse one body read received (or sent) at ``at_ns`` (perf_counter ns); returns
        the JSON chunks it completed, each already observed on the timeline."""
        return self._consume(self.parser.feed(data), at_ns)

    def close(self, at_ns: int) -> list[dict[str, Any]]:
        """End of body: parse what is left (see :meth:`SSEParser.close`)."""
        return self._consume(self.parser.close(), at_ns)

    @property
    def done(self) -> bool:
        """True once ``data: [DONE]`` was seen."""
        return self.parser.done

    def _consume(self, payloads: Iterable[str], at_ns: int) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        for payload in payloads:
            self.data_events += 1
            try:
                chunk = json.loads(payload)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                self.unparsed_payloads += 1
                self.timeline.observe(False, 0, at_ns=at_ns)
                continue
            if "choices" in chunk or "usage" in chunk:
                self.chat_chunks += 1
            visible = visible_token_count(chunk)
            self.timeline.observe(visible > 0, visible, at_ns=at_ns)
            output_tokens, input_tokens = usage_tokens(chunk)
            if output_tokens is not None or input_tokens is not None:
                self.timeline.set_usage(output_tokens, input_tokens)
            model = chunk.get("model")
            if isinstance(model, str) and model:
                self.response_model = model
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    self.finish_reasons.append(choice["finish_reason"])
            chunks.append(chunk)
        return chunks
