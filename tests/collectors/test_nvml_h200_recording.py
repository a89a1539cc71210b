"""A real GPU through the collector, the server and the read API: the exports ``inferpath
collect --nvml`` sent on an NVIDIA H200 going idle → loaded → idle (README in
``tests/data/nvml_h200/``), posted to a real server on chDB and read back, against what
``nvidia-smi`` read over the same seconds."""

from __future__ import annotations

import gzip
import statistics
import struct
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from inferpath.config import Settings
from inferpath.server.runtime import serve_in_thread

DATA = Path(__file__).resolve().parents[1] / "data" / "nvml_h200"
GIB = 1 << 30


def _exports() -> list[ExportMetricsServiceRequest]:
    raw = gzip.decompress((DATA / "otlp_metrics.bin.gz").read_bytes())
    out, i = [], 0
    while i < len(raw):
        (length,) = struct.unpack(">I", raw[i : i + 4])
        request = ExportMetricsServiceRequest()
        request.ParseFromString(raw[i + 4 : i + 4 + length])
        out.append(request)
        i += 4 + length
    return out


def _points(request: ExportMetricsServiceRequest):
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                yield from metric.gauge.data_points
                yield from metric.sum.data_points


def _smi_rows(offset_s: float) -> list[tuple[float, float, float, float]]:
    """(unix seconds shifted like the exports, utilization ratio, memory used bytes, power W)."""
    rows = []
    for line in (DATA / "nvidia_smi.csv").read_text().splitlines():
        when, _, _, util, used, _, power, _ = line.split(", ")
        at = datetime.strptime(when, "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
        rows.append((at + offset_s, float(util) / 100, float(used) * (1 << 20), float(power)))
    return rows


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory):
    exports = _exports()
    times = [p.time_unix_nano for e in exports for p in _points(e)]
    # Shifted to end a minute ago, inside any retention.
    offset_ns = time.time_ns() - 60 * 10**9 - max(times)
    for e in exports:
        for p in _points(e):
            p.time_unix_nano += offset_ns
            if p.start_time_unix_nano:
                p.start_time_unix_nano += offset_ns
    root = tmp_path_factory.mktemp("nvml_h200")
    server = serve_in_thread(Settings(store_url=f"chdb://{root / 'store'}"), port=0)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for e in exports:
                response = client.post(
                    "/v1/metrics", content=e.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
                )
                assert response.status_code == 200, response.text
            assert client.post("/api/v1/flush", timeout=120).json()["ok"]
            start = datetime.fromtimestamp((min(times) + offset_ns) / 1e9 - 1, tz=timezone.utc)
            end = datetime.fromtimestamp((max(times) + offset_ns) / 1e9 + 1, tz=timezone.utc)

            def series(metric: str) -> list[tuple[float, float]]:
                body = client.get(
                    "/api/v1/timeseries/gauge",
                    params={"metric": metric, "start": start.isoformat(), "end": end.isoformat(), "step_seconds": 1},
                ).json()
                points = [p for p in body["points"] if p["service_name"] == "nvml"]
                assert {p["attributes"]["modelName"] for p in points} == {"NVIDIA H200"}
                return [(datetime.fromisoformat(p["bucket"]).timestamp(), p["value"]) for p in points]

            yield series, offset_ns / 1e9
    finally:
        server.stop()


def test_the_gpu_reads_idle_then_loaded_then_idle(stored) -> None:
    series, _ = stored
    util = [v for _, v in series("gpu_utilization_ratio")]
    power = [v for _, v in series("gpu_power_watts")]
    used = [v for _, v in series("gpu_memory_used_bytes")]
    assert len(util) >= 30
    # Idle at both ends, saturated in the middle (matrix products without pause).
    assert util[:3] == [0.0, 0.0, 0.0] and util[-3:] == [0.0, 0.0, 0.0]
    assert sum(1 for v in util if v >= 0.99) >= 10
    assert max(power) > 600 and min(power) < 100
    # 16 GiB held (plus the CUDA context): the driver's reserved memory is not in "used".
    assert used[0] == 0.0 and 16 * GIB < max(used) < 18 * GIB
    total = series("gpu_memory_total_bytes")
    assert {v for _, v in total} == {143771 * (1 << 20)}


def test_the_read_api_agrees_with_nvidia_smi_over_the_same_seconds(stored) -> None:
    series, offset_s = stored
    smi = _smi_rows(offset_s)
    for metric, column, tolerance in (
        ("gpu_utilization_ratio", 1, lambda ref: 0.05),
        ("gpu_memory_used_bytes", 2, lambda ref: 0.02 * ref + 1 * (1 << 20)),
        ("gpu_power_watts", 3, lambda ref: 0.15 * ref),
    ):
        compared = 0
        for second, value in series(metric):
            same = [row[column] for row in smi if second <= row[0] < second + 1]
            # The two tools sample at different instants of a second (and NVML's utilization
            # covers the period before its sample): a second next to one in which the reading
            # moved (the load starting or ending) is not compared.
            around = [row[column] for row in smi if second - 1 <= row[0] < second + 2]
            if len(same) < 2 or max(around) - min(around) > tolerance(max(around)):
                continue
            reference = statistics.median(same)
            assert abs(value - reference) <= tolerance(reference), (metric, second, value, same)
            compared += 1
        assert compared >= 20, (metric, compared)
