"""An app instrumented with another team's LLM instrumentation, run as its own process by
``test_interop_packages.py``: it streams chat completions through the ``openai`` client
and exports its spans over OTLP/HTTP to an inferpath server.

    python interop_app.py SOURCE OTLP_BASE_URL MODEL_BASE_URL REQUESTS

SOURCE: ``openai-v2`` | ``openllmetry`` | ``openinference`` | ``langfuse``. Prints one JSON
line per request with what the client measured itself on ``perf_counter_ns`` (the monotonic
clock): ``ttft_ns`` (request start → first chunk with non-empty content, AIPerf's rule),
``e2e_ns`` (request start → end of the stream) and the usage chunk's token counts. The first
request warms the client up and is printed with ``"warmup": true``.
"""

from __future__ import annotations

import json
import os
import sys
import time


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
    """Instrument as the package's documentation says; returns (OpenAI class, shutdown)."""
    if source == "openai-v2":
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        tracer_provider = _sdk_provider(otlp_base_url)
        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider)
        from openai import OpenAI

        return OpenAI, tracer_provider.shutdown
    if source == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        tracer_provider = _sdk_provider(otlp_base_url)
        OpenAIInstrumentor().instrument(tracer_provider=tracer_provider)
        from openai import OpenAI

        return OpenAI, tracer_provider.shutdown
    if source == "openllmetry":
        from traceloop.sdk import Traceloop

        Traceloop.init(app_name="interop", exporter=_exporter(otlp_base_url), telemetry_enabled=False)
        from openai import OpenAI
        from opentelemetry import trace

        return OpenAI, trace.get_tracer_provider().shutdown
    if source == "langfuse":
        from langfuse import Langfuse

        # Langfuse's own span processor, its exporter pointed at inferpath instead of Langfuse Cloud.
        client = Langfuse(public_key="pk-lf-interop", secret_key="sk-lf-interop", base_url=otlp_base_url,
                          span_exporter=_exporter(otlp_base_url), flush_interval=0.1)
        from langfuse.openai import OpenAI

        return OpenAI, client.shutdown
    raise SystemExit(f"unknown source {source!r}")


def main() -> None:
    source, otlp_base_url, model_base_url, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    openai_class, shutdown = setup(source, otlp_base_url)
    client = openai_class(base_url=model_base_url, api_key="sk-interop", max_retries=0)
    for n in range(requests + 1):
        start_ns = time.perf_counter_ns()
        stream = client.chat.completions.create(
            model="emulated-7b", messages=[{"role": "user", "content": "Say hello"}], stream=True,
            stream_options={"include_usage": True})
        first_ns = None
        usage = None
        for chunk in stream:
            if first_ns is None and chunk.choices and chunk.choices[0].delta.content:
                first_ns = time.perf_counter_ns()
            if chunk.usage is not None:
                usage = chunk.usage
        end_ns = time.perf_counter_ns()
        print(json.dumps({"warmup": n == 0, "ttft_ns": first_ns - start_ns, "e2e_ns": end_ns - start_ns,
                          "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}),
              flush=True)
        time.sleep(0.05)
    shutdown()
    os._exit(0)  # leave no exporter thread to wait for


if __name__ == "__main__":
    main()
