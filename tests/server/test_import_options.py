"""``import_recording`` checks its options before it posts anything: a bad one leaves no partial import."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from inferpath.collectors.recording import RecordingError, import_recording, open_recording


def test_an_unknown_source_is_refused_before_any_body_is_posted(tmp_path: Path) -> None:
    (tmp_path / "otlp").mkdir()
    (tmp_path / "otlp" / "body.json").write_text('{"resourceSpans": []}')
    (tmp_path / "metrics_1700000000000000000.prom").write_text("vllm:num_requests_running 1\n")
    posted: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        posted.append(request.url.path)
        return httpx.Response(200, json={"ok": True})

    with httpx.Client(base_url="http://inferpath", transport=httpx.MockTransport(server)) as client:
        with pytest.raises(RecordingError, match="source: unknown 'nope', expected one of vllm, sglang"):
            import_recording(open_recording(tmp_path), client, source="nope")
        assert posted == []
        import_recording(open_recording(tmp_path), client, source="vllm")
    assert posted == ["/v1/traces", "/v1/metrics", "/api/v1/flush"]
