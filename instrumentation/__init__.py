"""inferpath.instrumentation: spans for the inference path, per docs/telemetry-contract.md.

Modules (each one concept): ``provider`` (tracer provider, OTLP export, drop counting),
``stages`` (``stage()``), ``streaming`` (SSE parsing, TTFT/ITL), ``asgi`` and ``fastapi``
(the server span), ``clients`` (streamed model calls over httpx), ``tokenizers``,
``context`` (trace context in threads), ``registry`` and ``api`` (``instrument()``).
Nothing is imported here, so ``import inferpath`` stays light.
"""
