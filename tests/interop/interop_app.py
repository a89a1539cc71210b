"""An app instrumented with another team's LLM instrumentation, run as its own process by
``test_interop_packages.py``: it streams chat completions through the ``openai`` client
and exports its spans over OTLP/HTTP to an inferpath server.

    python interop_app.py SOURCE OTLP_BASE_URL MODEL_BASE_URL REQUESTS

SOURCE: ``openai-v2`` | ``openllmetry`` | ``openinference`` | ``langfuse``. Prints one JSON
line per request (the first one warms the client up and says ``"warmup": true``):

- what the client measured itself on ``perf_counter_ns`` (the monotonic clock): ``ttft_ns``
  (request start → first chunk with non-empty content, AIPerf's rule), ``e2e_ns`` (request
  start → end of the stream) and the usage chunk's token counts;
- ``wall``: the same three moments on ``time_ns``, the clock the OpenTelemetry SDK stamps
  spans and events with, each read right beside its ``perf_counter_ns`` twin;
- ``span``: the request's model-call span as the SDK recorded it (a second, in-memory
  exporter on the same tracer provider): trace id, start, end, its events and the
  attributes a TTFT is read from, so the test can compare the stored row with the source's
  own stamps exactly;
- ``ttft_window`` / ``e2e_window``: inside ``[start, first token]`` and ``[start, end]``,
  how long the main thread was kept from running by something else: ``run_queue_wait_ns``
  (it was ready and the kernel gave the CPU to another process;
  ``/proc/thread-self/schedstat``, second field; 0 where the kernel does not report it) and
  ``other_threads_cpu_ns`` (the exporter's threads; while one runs it may hold the GIL); and
  ``cpu_ns``, the main thread's own CPU time.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

#: Attributes a TTFT is read from (docs/interop.md), printed with the span.
_TIMING_ATTRIBUTES = ("langfuse.observation.completion_start_time", "gen_ai.response.time_to_first_chunk")


def _exporter(otlp_base_url: str):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{otlp_base_url}/v1/traces")


def _sdk_provider(otlp_base_url: str):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # A batch processor, as in production: a simple one would export inside the stream's
    # last read, and the client's E2E would include the export.
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(_exporter(otlp_base_url), schedule_delay_millis=100))
    return tracer_provider


def setup(source: str, otlp_base_url: str):
    """Instrument as the package's documentation says; returns (OpenAI class, shutdown,
    the SDK tracer provider the instrumentation records with)."""
    from opentelemetry import trace

    if source in ("openai-v2", "openinference"):
        if source == "openai-v2":
            from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
        else:
            from openinference.instrumentation.openai import OpenAIInstrumentor

        tracer_provider = _sdk_provider(otlp_base_url)
        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider)
        from openai import OpenAI

        return OpenAI, tracer_provider.shutdown, tracer_provider
    if source == "openllmetry":
        from traceloop.sdk import Traceloop

        Traceloop.init(app_name="interop", exporter=_exporter(otlp_base_url), telemetry_enabled=False)
        from openai import OpenAI

        tracer_provider = trace.get_tracer_provider()
        return OpenAI, tracer_provider.shutdown, tracer_provider
    if source == "langfuse":
        from langfuse import Langfuse

        # Langfuse's own span processor, its exporter pointed at inferpath instead of Langfuse
        # Cloud; Langfuse registers its tracer provider globally.
        client = Langfuse(
            public_key="pk-lf-interop",
            secret_key="sk-lf-interop",
            base_url=otlp_base_url,
            span_exporter=_exporter(otlp_base_url),
            flush_interval=0.1,
        )
        from langfuse.openai import OpenAI

        return OpenAI, client.shutdown, trace.get_tracer_provider()
    raise SystemExit(f"unknown source {source!r}")


def _run_queue_wait_ns() -> int:
    """This thread's time spent ready to run but waiting for a CPU, ns (0 if not reported)."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _other_threads_cpu_ns() -> int:
    """CPU time of this process's threads other than the calling one, ns (each thread's own
    CPU clock, read live)."""
    me = threading.current_thread()
    total = 0
    for thread in threading.enumerate():
        if thread is me or thread.ident is None:
            continue
        try:
            total += time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):
            continue
    return total


def _marks() -> tuple[int, int, int]:
    """(run-queue wait, other threads' CPU time, this thread's CPU time), ns."""
    return _run_queue_wait_ns(), _other_threads_cpu_ns(), time.thread_time_ns()


def _since(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict:
    return {
        "run_queue_wait_ns": after[0] - before[0],
        "other_threads_cpu_ns": after[1] - before[1],
        "cpu_ns": after[2] - before[2],
    }


def _span_record(span) -> dict:
    return {
        "trace_id": format(span.context.trace_id, "032x"),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "events": [[event.name, event.timestamp] for event in span.events],
        "attributes": {key: span.attributes[key] for key in _TIMING_ATTRIBUTES if key in (span.attributes or {})},
    }


def main() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    source, otlp_base_url, model_base_url, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    openai_class, shutdown, tracer_provider = setup(source, otlp_base_url)
    own_copy = InMemorySpanExporter()
    tracer_provider.add_span_processor(SimpleSpanProcessor(own_copy))
    client = openai_class(base_url=model_base_url, api_key="sk-interop", max_retries=0)
    for n in range(requests + 1):
        own_copy.clear()
        marks_start = _marks()
        start_wall_ns = time.time_ns()
        start_ns = time.perf_counter_ns()
        stream = client.chat.completions.create(
            model="emulated-7b",
            messages=[{"role": "user", "content": "Say hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        first_ns = first_wall_ns = marks_first = None
        usage = None
        for chunk in stream:
            if first_ns is None and chunk.choices and chunk.choices[0].delta.content:
                first_ns = time.perf_counter_ns()
                first_wall_ns = time.time_ns()
                marks_first = _marks()
            if chunk.usage is not None:
                usage = chunk.usage
        end_ns = time.perf_counter_ns()
        end_wall_ns = time.time_ns()
        marks_end = _marks()
        roots = [span for span in own_copy.get_finished_spans() if span.parent is None]
        print(
            json.dumps(
                {
                    "warmup": n == 0,
                    "ttft_ns": first_ns - start_ns,
                    "e2e_ns": end_ns - start_ns,
                    "input_tokens": usage.prompt_tokens,
                    "output_tokens": usage.completion_tokens,
                    "wall": {"start_ns": start_wall_ns, "first_ns": first_wall_ns, "end_ns": end_wall_ns},
                    "span": _span_record(roots[0]) if roots else None,
                    "ttft_window": _since(marks_start, marks_first),
                    "e2e_window": _since(marks_start, marks_end),
                }
            ),
            flush=True,
        )
        time.sleep(0.05)
    shutdown()
    os._exit(0)  # leave no exporter thread to wait for


if __name__ == "__main__":
    main()
