"""instrument()/uninstrument() without an app, the integration registry, fork safety."""

from __future__ import annotations

import logging
import os

import pytest
from fastapi import FastAPI

import inferpath
from inferpath.instrumentation import provider, registry
from inferpath.instrumentation.asgi import InferpathASGIMiddleware
from inferpath.instrumentation.fastapi import is_instrumented


def test_instrument_without_app_covers_apps_built_afterwards(spans) -> None:
    inferpath.instrument(service_name="svc", span_exporter=spans.exporter)
    inferpath.instrument(service_name="svc", span_exporter=spans.exporter)
    try:
        app = FastAPI()
        assert is_instrumented(app)
        assert [m.cls for m in app.user_middleware].count(InferpathASGIMiddleware) == 1
        assert "fastapi" in registry.active_integrations()
    finally:
        inferpath.uninstrument()
    assert registry.active_integrations() == []
    assert not is_instrumented(FastAPI())
    assert not is_instrumented(app)


def test_instrument_rejects_bad_setup_before_touching_the_app(spans) -> None:
    app = FastAPI()
    with pytest.raises(ValueError, match="endpoint_class"):
        inferpath.instrument(app, service_name="svc", endpoint_class="fast")
    with pytest.raises(TypeError, match="Starlette"):
        inferpath.instrument(object(), service_name="svc")
    assert not is_instrumented(app)


def test_registry_skips_missing_and_broken_integrations(monkeypatch, caplog) -> None:
    monkeypatch.setattr(
        registry,
        "INTEGRATIONS",
        (
            registry.Integration("absent", "inferpath.instrumentation.fastapi", "no_such_library_for_inferpath"),
            registry.Integration("broken", "inferpath.instrumentation.no_such_module", "json"),
            registry.Integration("fastapi", "inferpath.instrumentation.fastapi", "fastapi"),
        ),
    )
    with caplog.at_level(logging.INFO, logger="inferpath.instrumentation.registry"):
        active = registry.instrument_integrations()
    try:
        assert active == ["fastapi"]
        messages = [r.getMessage() for r in caplog.records]
        assert sum("no_such_library_for_inferpath not installed" in m for m in messages) == 1
        assert sum("integration broken failed" in m for m in messages) == 1
    finally:
        registry.uninstrument_integrations()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_its_own_service_instance_id(spans) -> None:
    parent_id = provider.current_provider().resource.attributes["service.instance.id"]
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report the id its first span would carry, then leave at once
        try:
            provider.get_tracer()
            child_id = provider.current_provider().resource.attributes["service.instance.id"]
            os.write(write_end, child_id.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    child_id = os.read(read_end, 100).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    assert len(child_id) == 36 and child_id != parent_id
    assert provider.current_provider().resource.attributes["service.instance.id"] == parent_id
