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

    __slots__ = ("start_ns", "end_ns", "_last_silent_ns", "_silent_chunks", "_token_ns",
                 "_extra_tokens", "usage_output_tokens", "usage_input_tokens")

    def __init__(self, start_ns: int | None = None) -> None:
        self.start_ns: int = time.perf_counter_ns() if start_ns is None else start_ns
        self.end_ns: int | None = None
        self._last_silent_ns: int | None = None
        # Counts kept so that a one-token chunk is one list append (ChatStreamMeter's fast
        # path appends to ``_token_ns`` and nothing else).
        self._silent_chunks = 0  # chunks without a visible token
        self._token_ns: list[int] = []  # receipt of each visible-token chunk
        self._extra_tokens = 0  # tokens beyond one in visible-token chunks
        self.usage_output_tokens: int | None = None
        self.usage_input_tokens: int | None = None

    def observe(self, has_visible_token: bool, tokens: int = 1, *, at_ns: int | None = None) -> None:
        """Record one chunk received at ``at_ns`` (perf_counter ns; default now).

        ``has_visible_token`` says whether it carries a visible token (see
        :func:`visible_token_count`); ``tokens`` is how many it carries (≥ 1 when visible).
        """
        now_ns = time.perf_counter_ns() if at_ns is None else at_ns
        if has_visible_token and tokens > 0:
            self._token_ns.append(now_ns)
            self._extra_tokens += tokens - 1
        else:
            self._silent_chunks += 1
            self._last_silent_ns = now_ns

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
    def last_chunk_ns(self) -> int | None:
        """Receipt of the latest chunk (perf_counter ns), with or without a visible token;
        ``None`` before the first."""
        silent_ns = self._last_silent_ns
        if not self._token_ns:
            return silent_ns
        token_ns = self._token_ns[-1]
        return token_ns if silent_ns is None or token_ns >= silent_ns else silent_ns

    @property
    def finished(self) -> bool:
        return self.end_ns is not None

    @property
    def output_tokens(self) -> int:
        """Output tokens: ``usage.completion_tokens`` if reported, else visible tokens seen."""
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return len(self._token_ns) + self._extra_tokens

    @property
    def chunks(self) -> int:
        """Chunks observed, with or without a visible token."""
        return len(self._token_ns) + self._silent_chunks

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

    @property
    def idle(self) -> bool:
        """True between events: no partial line, event, ``\\r\\n`` or UTF-8 character held."""
        return (not self._buffer and self._data_lines is None and not self._pending_cr
                and not self._decoder.getstate()[0])

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


_DATA = b"data:"
_CONTENT_KEY = b'"content":'
_LEARN_TRIES = 8


class ChatStreamMeter:
    """SSE parser + token timeline for one OpenAI-style stream, fed raw body bytes.

    Shared by the gateway middleware (bytes it sends) and the model client (bytes it
    receives). Payloads that are not JSON objects are counted in
    ``unparsed_payloads`` and skipped; they never raise.

    Fast path. The plain one-token chunks that make up almost all of a stream are
    measured from their bytes, not by examining decoded JSON. A server writes them alike but
    for the content text, so a decoded chunk with exactly one visible token in a
    ``delta.content`` string written without escapes (one choice, no usage, no finish
    reason) becomes a template: its bytes before and after that text. A later complete
    ``data`` event is one visible token when it is that prefix + a non-empty text holding
    no ``"`` + that suffix. If such a payload is valid JSON, the content string ends at the
    suffix's first quote, as in the template (were that quote escaped by a trailing
    backslash, the string would run into the suffix, whose next quote opens a key or
    string, which is never valid JSON), so the chunk is the template with other, non-empty
    text: one visible token, same model, no usage or finish reason. TTFT, ITL, token and
    chunk counts, model and finish reasons thus come out as the full decode gives them,
    for every valid payload. Everything else (the first visible chunk, role-only, empty,
    ``null``-content, tool-call, reasoning, usage and finish chunks, text with a quote,
    comments, multi-line, CR-only or split events) goes through :class:`SSEParser` and
    ``json.loads``.

    With ``decode_chunks=True`` (the default, for callers that consume the chunks) a
    fast-path event is still ``json.loads``-ed for the caller, and goes the full path if
    that fails. With ``decode_chunks=False`` (the gateway middleware, the httpx
    integration without content capture) :meth:`feed` returns ``[]`` and a fast-path event
    is not decoded at all; the one difference that leaves is for invalid JSON: a payload
    that differs from the template only by a bad escape or raw control character in the
    text counts as a token there, where the full decode counts it in ``unparsed_payloads``.
    """

    __slots__ = ("parser", "timeline", "_decoded_events", "unparsed_payloads",
                 "_decoded_chat_chunks", "response_model", "finish_reasons", "decode_chunks",
                 "_template",
                 "_frame_template", "_fast_frame", "_parser_idle", "_decoded_visible",
                 "_append_token",
                 "_learned")

    def __init__(self, start_ns: int | None = None, *, decode_chunks: bool = True) -> None:
        self.parser = SSEParser()
        self.timeline = TokenTimeline(start_ns)
        self._decoded_events = 0
        self.unparsed_payloads = 0
        self._decoded_chat_chunks = 0
        # Fast-path events are derived: every visible-token stamp not from a decoded chunk.
        self._decoded_visible = 0
        self._append_token = self.timeline._token_ns.append
        self._learned = 0  # template learning attempts
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []
        self.decode_chunks = decode_chunks
        # (prefix, suffix) of a plain token chunk's payload, and of its ``data: `` event.
        self._template: tuple[bytes, bytes] | None = None
        # (prefix, suffix, head, tail, least size) of the whole ``data: `` event, and the
        # same while the SSE parser holds nothing (only then may a read skip it).
        self._frame_template: tuple[bytes, bytes, int, int, int] | None = None
        self._fast_frame: tuple[bytes, bytes, int, int, int] | None = None
        self._parser_idle = True

    def feed(self, data: bytes, at_ns: int) -> list[dict[str, Any]]:
        """Parse one body read received (or sent) at ``at_ns`` (perf_counter ns); returns
        the JSON chunks it completed, each already observed on the timeline (``[]`` when
        ``decode_chunks`` is False)."""
        frame = self._fast_frame
        if frame is not None:
            prefix, suffix, head, tail, least = frame
            # One plain token event in this read, the common case, in three C calls (each
            # costs more than the byte work). See the class docstring for why it is exact.
            try:
                size = len(data)
                plain = (size > least and data.find(b'"', head) == size - tail
                         and data.startswith(prefix) and data.endswith(suffix))
            except (TypeError, AttributeError):  # str or memoryview: the parser takes it
                plain = False
            if plain:
                if not self.decode_chunks:
                    self._append_token(at_ns)
                    return []
                try:
                    chunks = [json.loads(data[6:-2])]
                except ValueError:  # malformed text; the full path counts it
                    chunks = None
                if chunks is not None:
                    self._append_token(at_ns)
                    return chunks
        if not self._parser_idle or not isinstance(data, bytes):
            return self._feed_parser(data, at_ns)
        chunks: list[dict[str, Any]] = []
        rest = self._feed_events(data, at_ns, chunks)
        if rest:
            chunks.extend(self._feed_parser(rest, at_ns))
        return chunks

    def close(self, at_ns: int) -> list[dict[str, Any]]:
        """End of body: parse what is left (see :meth:`SSEParser.close`)."""
        return self._consume(self.parser.close(), at_ns)

    @property
    def done(self) -> bool:
        """True once ``data: [DONE]`` was seen."""
        return self.parser.done

    @property
    def _fast_events(self) -> int:
        """Plain token events measured from their bytes (each a data event, a chat chunk)."""
        return len(self.timeline._token_ns) - self._decoded_visible

    @property
    def data_events(self) -> int:
        """SSE ``data`` events seen, ``[DONE]`` excluded."""
        return self._decoded_events + self._fast_events

    @property
    def chat_chunks(self) -> int:
        """Payloads shaped like OpenAI chunks (a ``choices`` or ``usage`` key)."""
        return self._decoded_chat_chunks + self._fast_events

    def _feed_parser(self, data: bytes | str, at_ns: int) -> list[dict[str, Any]]:
        chunks = self._consume(self.parser.feed(data), at_ns)
        self._parser_idle = self.parser.idle
        self._fast_frame = self._frame_template if self._parser_idle else None
        return chunks

    def _feed_events(self, data: bytes, at_ns: int, chunks: list[dict[str, Any]]) -> bytes:
        """Measure the complete one-line ``data`` events at the head of ``data`` (lines
        ending in ``\\n`` or ``\\r\\n``); returns the rest, from the first event this path
        does not take, for the SSE parser. Called only while the parser holds nothing, so
        every event is parsed exactly once. Decoded chunks are appended to ``chunks``."""
        if data.find(b"\r") != -1:
            normalized = data.replace(b"\r\n", b"\n")
            if normalized.find(b"\r") != -1:  # a lone or split CR: the SSE parser's job
                return data
            data = normalized
        start = 0
        length = len(data)
        while start < length:
            end = data.find(b"\n\n", start)
            if end == -1 or not data.startswith(_DATA, start) or data.find(b"\n", start) != end:
                break  # incomplete, not a data event, or more than one line
            body = start + 6 if data[start + 5:start + 6] == b" " else start + 5
            payload = data[body:end]
            plain = self._is_plain_token(payload)
            if plain and self.decode_chunks:
                try:
                    chunks.append(json.loads(payload))
                except ValueError:  # malformed text; the full path counts it
                    plain = False
            if plain:
                self._append_token(at_ns)
            elif payload.strip() == b"[DONE]":
                self.parser.done = True
            else:
                chunks.extend(self._consume((payload.decode("utf-8", "replace"),), at_ns, payload))
            start = end + 2
        return data[start:] if start else data

    def _is_plain_token(self, payload: bytes) -> bool:
        template = self._template
        if template is None:
            return False
        prefix, suffix = template
        if len(payload) <= len(prefix) + len(suffix):
            return False
        if not (payload.startswith(prefix) and payload.endswith(suffix)):
            return False
        return payload.find(b'"', len(prefix)) == len(payload) - len(suffix)

    def _learn_template(self, chunk: dict[str, Any], raw: bytes) -> None:
        """Keep ``raw`` (the payload of ``chunk``) as the plain-token template when it is
        one choice whose only visible token is a ``delta.content`` string written without
        escapes, and it carries no usage or finish reason."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or chunk.get("usage") is not None:
            return
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or choice.get("finish_reason") is not None:
            return
        content = delta.get("content")
        if not isinstance(content, str) or not content or "text" in choice:
            return
        if any(_non_empty(delta.get(key))
               for key in ("tool_calls", "reasoning_content", "reasoning")):
            return
        if raw.count(_CONTENT_KEY) != 1:
            return
        key = raw.find(_CONTENT_KEY) + len(_CONTENT_KEY)
        if raw[key:key + 1] == b" ":
            key += 1
        if raw[key:key + 1] != b'"':
            return
        close = raw.find(b'"', key + 1)
        text = raw[key + 1:close]
        if close == -1 or b"\\" in text or text.decode("utf-8", "replace") != content:
            return
        prefix, suffix = raw[:key + 1], raw[close:]
        self._template = (prefix, suffix)
        head, tail = 6 + len(prefix), len(suffix) + 2
        self._frame_template = (b"data: " + prefix, suffix + b"\n\n", head, tail, head + tail)
        if self._parser_idle:
            self._fast_frame = self._frame_template

    def _consume(self, payloads: Iterable[str], at_ns: int,
                 raw: bytes | None = None) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        for payload in payloads:
            self._decoded_events += 1
            try:
                chunk = json.loads(payload)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                self.unparsed_payloads += 1
                self.timeline.observe(False, 0, at_ns=at_ns)
                continue
            if "choices" in chunk or "usage" in chunk:
                self._decoded_chat_chunks += 1
            visible = visible_token_count(chunk)
            self.timeline.observe(visible > 0, visible, at_ns=at_ns)
            if visible > 0:
                self._decoded_visible += 1
            output_tokens, input_tokens = usage_tokens(chunk)
            if output_tokens is not None or input_tokens is not None:
                self.timeline.set_usage(output_tokens, input_tokens)
            model = chunk.get("model")
            if isinstance(model, str) and model:
                self.response_model = model
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    self.finish_reasons.append(choice["finish_reason"])
            if self.decode_chunks:
                chunks.append(chunk)
            # A stream whose chunks never repeat a template (per-chunk ids or logprobs)
            # stops paying for learning after a few tries.
            if visible == 1 and (self._learned < _LEARN_TRIES or self._fast_events > self._learned):
                self._learned += 1
                self._learn_template(chunk, payload.encode() if raw is None else raw)
        return chunks
