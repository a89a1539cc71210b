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
from collections.abc import Iterable, Sequence
from typing import Any

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

    __slots__ = (
        "start_ns",
        "end_ns",
        "_last_silent_ns",
        "_silent_chunks",
        "_token_ns",
        "_extra_tokens",
        "usage_output_tokens",
        "usage_input_tokens",
    )

    def __init__(self, start_ns: int | None = None) -> None:
        self.start_ns: int = time.perf_counter_ns() if start_ns is None else start_ns
        self.end_ns: int | None = None
        # Kept so that recording a one-token chunk is one list append: ChatStreamMeter's
        # byte-level path appends to ``_token_ns`` and touches nothing else.
        self._token_ns: list[int] = []  # receipt of each visible-token chunk
        self._extra_tokens = 0  # tokens beyond one in visible-token chunks (several choices)
        self._silent_chunks = 0  # chunks without a visible token
        self._last_silent_ns: int | None = None
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
    def finished(self) -> bool:
        return self.end_ns is not None

    @property
    def last_chunk_ns(self) -> int | None:
        """Receipt of the latest chunk, with or without a visible token (perf_counter ns);
        ``None`` before the first."""
        silent_ns = self._last_silent_ns
        if not self._token_ns:
            return silent_ns
        token_ns = self._token_ns[-1]
        return token_ns if silent_ns is None or token_ns >= silent_ns else silent_ns

    @property
    def chunks(self) -> int:
        """Chunks observed, with or without a visible token."""
        return len(self._token_ns) + self._silent_chunks

    @property
    def output_tokens(self) -> int:
        """Output tokens: ``usage.completion_tokens`` if reported, else visible tokens seen."""
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return len(self._token_ns) + self._extra_tokens

    @property
    def visible_chunks(self) -> int:
        """Chunks that carried at least one visible token."""
        return len(self._token_ns)

    @property
    def token_ns(self) -> tuple[int, ...]:
        """Receipt of each visible-token chunk (perf_counter ns), in order; TTFT and the ITL
        list derive from it."""
        return tuple(self._token_ns)

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
        """True between events: no partial line, open event, pending ``\\r`` or partial
        UTF-8 character is held, so the next byte starts a new event."""
        return (
            not self._buffer and self._data_lines is None and not self._pending_cr and not self._decoder.getstate()[0]
        )

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
        if (
            _non_empty(delta.get("content"))
            or _non_empty(delta.get("tool_calls"))
            or _non_empty(delta.get("reasoning_content"))
            or _non_empty(delta.get("reasoning"))
        ):
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


_FRAME_START = b"data: "
_FRAME_END = b"\n\n"
_CONTENT_KEY = b'"content":'
# Template learning attempts allowed before the byte-level path has paid for them: a stream
# whose chunks never repeat (per-chunk ids or logprobs) stops trying after a few.
_LEARN_TRIES = 8
_NO_CHUNKS: tuple[dict[str, Any], ...] = ()
# Bytes that may follow a closed JSON string (and the end of the bytes).
_AFTER_STRING = frozenset((b"", b",", b"}", b"]", b":", b" ", b"\t", b"\r", b"\n"))


class ChatStreamMeter:
    """SSE parser + token timeline for one OpenAI-style stream, fed raw body bytes.

    Shared by the gateway middleware (bytes it sends) and the model clients (bytes they
    receive). Every ``data`` event is stamped with the read that *completed* it (the
    ``at_ns`` of the :meth:`feed` call whose bytes end the event), never the read where it
    started. Payloads that are not JSON objects are counted in ``unparsed_payloads`` and
    skipped; nothing here raises on stream content.

    Byte-level path. JSON is decoded only for the events that can change a measure: the
    first visible token, role-only / empty / ``null`` deltas, tool-call and reasoning
    deltas, finish and usage chunks, anything unusual. The plain one-token chunks that make
    up almost all of a stream are recognised from their bytes: a server writes them alike
    but for the content text, so a decoded chunk with one choice whose only visible token is
    a ``delta.content`` string written without escapes (no usage, no finish reason) becomes
    a template, its payload bytes before and after that text. A later complete event whose
    payload is that prefix + a non-empty text holding no ``"`` + that suffix is one visible
    token. Why that is exact for valid JSON: the content string opens at the prefix's last
    byte and, as the text holds no quote, closes at the suffix's first byte (were that quote
    escaped by a trailing backslash, the string would run on to the suffix's next quote, and
    a template is kept only if the byte after that quote cannot follow a string, e.g. the
    ``f`` of ``"finish_reason"``, so such a payload is not JSON); so the chunk is the
    template with other, non-empty text: one visible token, same model, no usage, no finish
    reason. The template is dropped when a decoded chunk names another model, and relearned
    from a later chunk when the server's bytes change (e.g. a new ``created`` second).

    ``decode_chunks=True`` (default; callers that consume the chunks, such as
    :func:`~inferpath.instrumentation.clients.stream_chat_completion`): a byte-level event
    is still ``json.loads``-ed for the caller, and goes the full path if that fails, so every
    measure equals the full decode's. ``decode_chunks=False`` (the gateway middleware, the
    httpx integration without content capture): :meth:`feed` returns no chunks and a
    byte-level event is not decoded; the one difference left is on invalid JSON: a payload
    that differs from the template only by a bad escape or raw control character in the
    text counts as a token there, where the full decode counts it in ``unparsed_payloads``.

    Counters: ``data_events`` (SSE ``data`` events, ``[DONE]`` excluded), ``chat_chunks``
    (payloads with a ``choices`` or ``usage`` key), ``unparsed_payloads``,
    ``decoded_payloads`` (events decoded to be measured, i.e. not by their bytes).
    """

    __slots__ = (
        "parser",
        "timeline",
        "decode_chunks",
        "unparsed_payloads",
        "decoded_payloads",
        "response_model",
        "finish_reasons",
        "_decoded_chat_chunks",
        "_decoded_visible",
        "_append_token",
        "_template",
        "_frame",
        "_fast_frame",
        "_parser_idle",
        "_learned",
    )

    def __init__(self, start_ns: int | None = None, *, decode_chunks: bool = True) -> None:
        self.parser = SSEParser()
        self.timeline = TokenTimeline(start_ns)
        self.decode_chunks = decode_chunks
        self.unparsed_payloads = 0
        self.decoded_payloads = 0
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []
        self._decoded_chat_chunks = 0
        self._decoded_visible = 0  # visible-token stamps that came from decoded chunks
        self._append_token = self.timeline._token_ns.append
        # (payload prefix, payload suffix, least payload size, model) of a plain token chunk.
        self._template: tuple[bytes, bytes, int, Any] | None = None
        # The same as a whole one-event read: (``data: `` + prefix, suffix + ``\n\n``,
        # prefix length, suffix length, least size); ``_fast_frame`` holds it only while the
        # SSE parser holds nothing, the one state in which a read may bypass the parser.
        self._frame: tuple[bytes, bytes, int, int, int] | None = None
        self._fast_frame: tuple[bytes, bytes, int, int, int] | None = None
        self._parser_idle = True
        self._learned = 0

    def feed(self, data: bytes, at_ns: int) -> Sequence[dict[str, Any]]:
        """Measure one body read received (or sent) at ``at_ns`` (perf_counter ns).

        Returns the JSON chunks the read completed, in order, each already observed on the
        timeline (nothing when ``decode_chunks`` is False). ``data`` is bytes (``str`` is
        accepted and goes through the parser).
        """
        frame = self._fast_frame
        if frame is not None:
            prefix, suffix, head, tail, least = frame
            # The common read: exactly one plain token event, settled by three C calls.
            try:
                size = len(data)
                plain = (
                    size > least
                    and data.find(b'"', head) == size - tail
                    and data.startswith(prefix)
                    and data.endswith(suffix)
                )
            except TypeError:  # a str read: the parser takes it
                plain = False
            if plain:
                if not self.decode_chunks:
                    self._append_token(at_ns)
                    return _NO_CHUNKS
                try:
                    chunk = json.loads(data[6:-2])
                except ValueError:  # malformed text: the full path counts it
                    chunk = None
                if chunk is not None:
                    self._append_token(at_ns)
                    return (chunk,)
        if self._parser_idle and isinstance(data, bytes):
            chunks: list[dict[str, Any]] = []
            rest = self._feed_events(data, at_ns, chunks)
            if rest:
                chunks.extend(self._feed_parser(rest, at_ns))
            return chunks
        return self._feed_parser(data, at_ns)

    def close(self, at_ns: int) -> Sequence[dict[str, Any]]:
        """End of body: parse what is left (see :meth:`SSEParser.close`)."""
        return self._consume(self.parser.close(), at_ns)

    @property
    def done(self) -> bool:
        """True once ``data: [DONE]`` was seen."""
        return self.parser.done

    @property
    def _byte_level_events(self) -> int:
        return len(self.timeline._token_ns) - self._decoded_visible

    @property
    def data_events(self) -> int:
        """SSE ``data`` events seen, ``[DONE]`` excluded."""
        return self.decoded_payloads + self._byte_level_events

    @property
    def chat_chunks(self) -> int:
        """Payloads shaped like OpenAI chunks (a ``choices`` or ``usage`` key)."""
        return self._decoded_chat_chunks + self._byte_level_events

    def _feed_parser(self, data: bytes | str, at_ns: int) -> list[dict[str, Any]]:
        chunks = self._consume(self.parser.feed(data), at_ns)
        idle = self._parser_idle = self.parser.idle
        self._fast_frame = self._frame if idle else None
        return chunks

    def _feed_events(self, data: bytes, at_ns: int, chunks: list[dict[str, Any]]) -> bytes:
        """Measure the complete one-line ``data`` events at the head of ``data``; returns the
        rest, from the first thing this does not take (a partial, multi-line or non-data
        event, a comment, a lone ``\\r``), for the SSE parser. Called only while the parser
        holds nothing, so every event is parsed exactly once, by one of the two."""
        if b"\r" in data:
            normalized = data.replace(b"\r\n", b"\n")
            if b"\r" in normalized:  # a lone or split CR line end: the parser's job
                return data
            data = normalized
        start = 0
        length = len(data)
        while start < length:
            end = data.find(_FRAME_END, start)
            if end == -1 or not data.startswith(b"data:", start) or data.find(b"\n", start) != end:
                break
            body = start + 6 if data[start + 5 : start + 6] == b" " else start + 5
            payload = data[body:end]
            start = end + 2
            if self._is_plain_token(payload):
                if not self.decode_chunks:
                    self._append_token(at_ns)
                    continue
                try:
                    chunks.append(json.loads(payload))
                    self._append_token(at_ns)
                    continue
                except ValueError:  # malformed text: the full path counts it
                    pass
            if payload.strip() == b"[DONE]":
                self.parser.done = True
            else:
                chunks.extend(self._consume((payload.decode("utf-8", "replace"),), at_ns, payload))
        return data[start:] if start else data

    def _is_plain_token(self, payload: bytes) -> bool:
        template = self._template
        if template is None:
            return False
        prefix, suffix, least, _model = template
        size = len(payload)
        return (
            size > least
            and payload.find(b'"', len(prefix)) == size - len(suffix)
            and payload.startswith(prefix)
            and payload.endswith(suffix)
        )

    def _forget_template(self) -> None:
        self._template = self._frame = self._fast_frame = None

    def _learn_template(self, chunk: dict[str, Any], raw: bytes) -> None:
        """Keep ``raw`` (the payload bytes of ``chunk``) as the plain-token template when the
        chunk is one choice whose only visible token is a ``delta.content`` string written
        without escapes, with no usage and no finish reason."""
        choices = chunk.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or chunk.get("usage") is not None:
            return
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict) or choice.get("finish_reason") is not None or "text" in choice:
            return
        text = delta.get("content")
        if not isinstance(text, str) or not text:
            return
        if any(_non_empty(delta.get(key)) for key in ("tool_calls", "reasoning_content", "reasoning")):
            return
        if raw.count(_CONTENT_KEY) != 1:
            return
        opening = raw.find(_CONTENT_KEY) + len(_CONTENT_KEY)
        while raw[opening : opening + 1] in (b" ", b"\t", b"\n", b"\r"):
            opening += 1
        if raw[opening : opening + 1] != b'"':
            return
        closing = raw.find(b'"', opening + 1)
        written = raw[opening + 1 : closing]
        if closing == -1 or b"\\" in written or written.decode("utf-8", "replace") != text:
            return
        prefix, suffix = raw[: opening + 1], raw[closing:]
        after_next_quote = suffix.find(b'"', 1) + 1
        if after_next_quote and suffix[after_next_quote : after_next_quote + 1] in _AFTER_STRING:
            return  # a text ending in a backslash could then be valid JSON (class docstring)
        self._template = (prefix, suffix, len(prefix) + len(suffix), chunk.get("model"))
        frame_prefix, frame_suffix = _FRAME_START + prefix, suffix + _FRAME_END
        self._frame = (
            frame_prefix,
            frame_suffix,
            len(frame_prefix),
            len(frame_suffix),
            len(frame_prefix) + len(frame_suffix),
        )
        self._fast_frame = self._frame if self._parser_idle else None

    def _consume(self, payloads: Iterable[str], at_ns: int, raw: bytes | None = None) -> list[dict[str, Any]]:
        chunks: list[dict[str, Any]] = []
        timeline = self.timeline
        for payload in payloads:
            self.decoded_payloads += 1
            try:
                chunk = json.loads(payload)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                self.unparsed_payloads += 1
                timeline.observe(False, 0, at_ns=at_ns)
                continue
            if "choices" in chunk or "usage" in chunk:
                self._decoded_chat_chunks += 1
            visible = visible_token_count(chunk)
            timeline.observe(visible > 0, visible, at_ns=at_ns)
            if visible > 0:
                self._decoded_visible += 1
            output_tokens, input_tokens = usage_tokens(chunk)
            if output_tokens is not None or input_tokens is not None:
                timeline.set_usage(output_tokens, input_tokens)
            model = chunk.get("model")
            if isinstance(model, str) and model:
                self.response_model = model
                template = self._template
                if template is not None and template[3] != model:
                    # A byte-level chunk must leave the model the template names.
                    self._forget_template()
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    self.finish_reasons.append(choice["finish_reason"])
            if self.decode_chunks:
                chunks.append(chunk)
            if visible == 1 and (self._learned < _LEARN_TRIES or self._byte_level_events > self._learned):
                self._learned += 1
                self._learn_template(chunk, payload.encode() if raw is None else raw)
        return chunks
