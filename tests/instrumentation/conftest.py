"""Fixtures for the instrumentation tests: an in-memory span sink behind the real SDK
batch processor, and real uvicorn servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferpath.demo.processes import free_port
from inferpath.instrumentation import provider


class SpanSink:
    """The spans the configured provider exported, read after a flush."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def finished(self, *, wait_for: int = 0, timeout_seconds: float = 5.0) -> list[ReadableSpan]:
        """Flush and return the exported spans; waits (bounded) until at least ``wait_for``
        arrived, for spans that end on a server thread after the client saw the response."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            provider.force_flush(2.0)
            spans = list(self.exporter.get_finished_spans())
            if len(spans) >= wait_for or time.monotonic() > deadline:
                return spans
            time.sleep(0.02)

    def named(self, name: str, **kwargs: Any) -> list[ReadableSpan]:
        return [s for s in self.finished(**kwargs) if s.name == name]


@pytest.fixture()
def spans() -> Iterator[SpanSink]:
    """A freshly configured inferpath provider exporting into memory."""
    exporter = InMemorySpanExporter()
    provider.configure("instrumentation-tests", span_exporter=exporter, schedule_delay_seconds=0.05)
    yield SpanSink(exporter)
    provider.shutdown(2.0)


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
