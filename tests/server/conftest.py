"""Fixtures of the server tests."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from inferpath.server.otlp import decode_trace_request
from inferpath.storage.rows import SpanRow


@pytest.fixture(scope="module")
def vllm_spans_by_trace(shared_data: Path) -> dict[str, list[SpanRow]]:
    """The spans vLLM exported under load and at start-up (``vllm_live_capture``), decoded
    and grouped by trace id."""
    folder = shared_data / "vllm_live_capture"
    by_trace: dict[str, list[SpanRow]] = defaultdict(list)
    for path in sorted((folder / "otlp").glob("*.pb")) + sorted((folder / "startup_otlp").glob("*.pb")):
        for span in decode_trace_request(
            path.read_bytes(), content_type="application/x-protobuf", content_encoding=None
        ).spans:
            by_trace[span.trace_id].append(span)
    return dict(by_trace)
