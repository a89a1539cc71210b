"""Load a recorded incident into a server, so it can be diagnosed after the fact.

A recording is what a collector and an OTLP receiver would have seen, kept as files:

- Prometheus text scrapes with their times, either one file per scrape named
  ``metrics_<unix_ns>.prom`` (optionally ``.gz``), or one exposition whose samples carry
  timestamps (the form ``promtool tsdb create-blocks-from openmetrics`` backfills from:
  OpenMetrics ends with ``# EOF`` and its timestamps are seconds; Prometheus text timestamps
  are milliseconds);
- OTLP/HTTP trace bodies as they were posted: ``*.pb`` (protobuf ``ExportTraceServiceRequest``)
  or ``*.json`` (OTLP/JSON, ids in hex), gzip-compressed or not (``*.pb.gz``, or the bytes an
  exporter with gzip compression posted), in ``otlp/``, ``startup_otlp/`` or ``traces/``; read
  by the receiver's own parser.

A folder in that layout, or a ``.tar.gz``/``.tgz`` of one, is read. The engine kind of the
scrapes (vLLM, SGLang, TGI, Triton, TRT-LLM, dcgm-exporter) is recognised from the metric
names. Each scrape goes through the collectors' own parser and catalog and becomes OTLP
metrics stamped with its recorded time, as ``inferpath collect`` would have posted it
(:data:`SCRAPES_PER_BODY` scrapes to a body: the server stores each body with one insert);
each trace body is posted to ``/v1/traces`` as it was. Times are kept, unless the recording
is older than the store keeps data (its TTL): then everything moves by one offset so it ends
an hour ago, and the offset is reported so windows can be moved with it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from inferpath.collectors.agent import retry_after_seconds

SCRAPES_PER_BODY = 32
"""Scrapes posted in one OTLP metrics body (each keeps its own timestamps)."""
SCRAPE_FILE = re.compile(r"^metrics_(\d{10,20})\.prom(\.gz)?$")
TRACE_FOLDERS = ("startup_otlp", "otlp", "traces")
SOURCE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("vllm:", "vllm"),
    ("sglang:", "sglang"),
    ("tgi_", "tgi"),
    ("nv_inference", "triton"),
    ("trtllm_", "trtllm"),
    ("DCGM_FI_", "dcgm"),
)
"""Metric-name prefix → collector source, for recognising what a scrape came from."""
PROTOBUF = {"content-type": "application/x-protobuf"}
HOUR_NS = 3600 * 10**9
DAY_NS = 24 * HOUR_NS


class RecordingError(ValueError):
    """A recording that cannot be read; the message names the file and what was wrong."""


@dataclass
class Recording:
    """The files of one recording: ``scrapes`` as (unix ns, Prometheus text without
    timestamps), oldest first; ``trace_files`` the OTLP bodies in posting order;
    ``ground_truth`` the parsed ``ground_truth.json`` when present (recordings made for
    tests carry one)."""

    root: Path
    scrapes: list[tuple[int, str]] = field(default_factory=list)
    trace_files: list[Path] = field(default_factory=list)
    ground_truth: dict[str, Any] | None = None

    def time_range_ns(self) -> tuple[int, int] | None:
        """(first, last) scrape time in unix ns, ``None`` without scrapes."""
        return (self.scrapes[0][0], self.scrapes[-1][0]) if self.scrapes else None


@dataclass
class ImportResult:
    """What :func:`post_import` posted: counts (``scrapes``: those of a known source), the
    ``offset_ns`` added to every time, the engine ``source`` recognised and the time range
    covering every scrape and span (aware UTC datetimes, after the offset; ``end`` exclusive)."""

    scrapes: int
    trace_bodies: int
    offset_ns: int
    source: str | None
    start: datetime | None
    end: datetime | None
    flushed: bool


def open_recording(path: str | Path, *, workdir: str | Path | None = None) -> Recording:
    """Read the recording at ``path`` (a folder or a ``.tar.gz``; module docstring). A
    tarball is unpacked under ``workdir`` (default: a new temporary folder). Raises
    :class:`RecordingError` for a missing path, an unsafe or unreadable archive, or a folder
    with neither scrapes nor trace bodies."""
    root = given = Path(path)
    if not root.exists():
        raise RecordingError(f"{root}: no such file or folder")
    if root.is_file():
        if not root.name.endswith((".tar.gz", ".tgz", ".tar")):
            if root.name.endswith((".prom", ".om", ".txt", ".prom.gz")):
                return Recording(root=root.parent, scrapes=_timestamped_scrapes(root, _read_text(root)))
            raise RecordingError(f"{root}: expected a folder, a .tar.gz of one, or an exposition file")
        root = _unpack(root, Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="inferpath-recording-")))
    recording = Recording(root=root)
    for file in [root, *sorted(root.rglob("*"))]:
        if file.is_dir() and not os.access(file, os.R_OK | os.X_OK):  # rglob would skip it silently
            raise RecordingError(f"{file}: the folder cannot be read (permission denied); make it readable")
        if not file.is_file():
            continue
        match = SCRAPE_FILE.match(file.name)
        if match:
            recording.scrapes.append((int(match.group(1)), _read_text(file)))
        elif file.suffix in (".om",) or file.name.endswith((".om.gz",)):
            recording.scrapes.extend(_timestamped_scrapes(file, _read_text(file)))
        elif file.parent.name in TRACE_FOLDERS and file.name.endswith((".pb", ".json", ".pb.gz", ".json.gz")):
            recording.trace_files.append(file)
        elif file.name == "ground_truth.json":
            try:
                recording.ground_truth = json.loads(file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise RecordingError(f"{file}: not valid JSON ({exc})") from None
            except OSError as exc:
                raise RecordingError(f"{file}: cannot be read ({exc.strerror or exc})") from None
    recording.scrapes.sort(key=lambda item: item[0])
    # Start-up traces first (the engine loaded before it served), then by receive time.
    recording.trace_files.sort(key=lambda f: (TRACE_FOLDERS.index(f.parent.name), f.name))
    if not recording.scrapes and not recording.trace_files:
        raise RecordingError(
            f"{given}: no scrapes (metrics_<unix_ns>.prom, *.om) and no OTLP trace bodies (otlp/*.pb, otlp/*.json) found"
        )
    return recording


def _unpack(archive: Path, into: Path) -> Path:
    if archive.stat().st_size == 0:
        raise RecordingError(f"{archive}: the archive is empty")
    into.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")  # refuses absolute paths, .. and links out of `into`
    except tarfile.ReadError:
        raise RecordingError(f"{archive}: not a tar archive (or a damaged one)") from None
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise RecordingError(f"{archive}: the archive is cut short or damaged; copy it again") from None
    except (tarfile.TarError, OSError) as exc:
        raise RecordingError(f"{archive}: cannot unpack ({exc})") from None
    entries = [p for p in into.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


def _read_text(file: Path) -> str:
    try:
        data = file.read_bytes()
        if file.name.endswith(".gz"):
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise RecordingError(f"{file}: cannot be read as text ({exc})") from None


def _timestamped_scrapes(file: Path, text: str) -> list[tuple[int, str]]:
    """Split an exposition whose samples carry timestamps into one text per timestamp."""
    openmetrics = text.rstrip().endswith("# EOF")
    comments: list[str] = []
    groups: dict[int, list[str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("# EOF"):
            continue
        if line.startswith("#"):
            comments.append(line)
            continue
        parts = line.rsplit(" ", 2)
        if len(parts) == 3 and _is_number(parts[2]) and not _is_number(parts[1]):
            raise RecordingError(f"{file}:{number}: the sample's value {parts[1]!r} is not a number")
        if len(parts) < 2 or not _is_number(parts[-1]):
            # Not a sample line at all (a value must be a number): not an exposition.
            raise RecordingError(
                f"{file}:{number}: not a Prometheus exposition sample ({line[:60]!r}); a recording is a folder or "
                ".tar.gz of metrics_<unix_ns>.prom scrapes and otlp/*.pb bodies, or one exposition whose samples "
                "carry timestamps"
            )
        if len(parts) != 3 or not _is_number(parts[1]) or not _is_number(parts[2]):
            raise RecordingError(
                f"{file}:{number}: a sample without a timestamp; a single exposition must "
                "carry one on every sample (or use one metrics_<unix_ns>.prom file per scrape)"
            )
        stamp = float(parts[2])
        at_ns = int(round(stamp * 1e9)) if openmetrics else int(stamp) * 1_000_000
        groups.setdefault(at_ns, []).append(f"{parts[0]} {parts[1]}")
    head = "\n".join(c for c in comments if c.startswith(("# HELP", "# TYPE")))
    return [(at, head + "\n" + "\n".join(lines) + "\n") for at, lines in sorted(groups.items())]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def detect_source(text: str) -> str | None:
    """The collector source whose metric names fill most of ``text``, ``None`` if none."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for prefix, source in SOURCE_PREFIXES:
            if line.startswith(prefix):
                counts[source] = counts.get(source, 0) + 1
                break
    return max(counts, key=lambda s: counts[s]) if counts else None


def choose_offset_ns(recording: Recording, *, ttl_days: int, now_ns: int, shift: str = "auto") -> int:
    """The offset added to every time: 0 for ``shift="none"``; for ``"now"`` the one that makes
    the recording end an hour ago; for ``"auto"`` that one only when the recording would
    otherwise be older than ``ttl_days`` less a day (its rows would be dropped on insert).
    Raises ``ValueError`` for another ``shift``."""
    if shift not in ("auto", "none", "now"):
        raise ValueError(f"shift must be auto, none or now, got {shift!r}")
    last = _last_time_ns(recording)
    if shift == "none" or last is None:
        return 0
    to_now = now_ns - HOUR_NS - last
    if shift == "now" or last < now_ns - (ttl_days - 1) * DAY_NS:
        return to_now
    return 0


def _last_time_ns(recording: Recording) -> int | None:
    if recording.scrapes:
        return recording.scrapes[-1][0]
    ends = [span.end_time_unix_nano for body in _trace_requests(recording) for span in _spans(body)]
    return max(ends) if ends else None


def _trace_requests(recording: Recording) -> Iterator[Any]:
    """Each trace body as the receiver reads it (its parser: OTLP/JSON ids in hex), gzip
    bodies inflated first: an exporter with ``OTEL_EXPORTER_OTLP_COMPRESSION=gzip`` posts
    them so, and a capture keeps them as received."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from inferpath.server.otlp_body import OTLPDecodeError, decompress, parse_message

    for file in recording.trace_files:
        request = ExportTraceServiceRequest()
        try:
            body = file.read_bytes()
        except OSError as exc:
            raise RecordingError(f"{file}: cannot be read ({exc.strerror or exc})") from None
        try:
            payload = decompress(body, "gzip" if body[:2] == b"\x1f\x8b" else None)
            parse_message(payload, "json" if ".json" in file.suffixes else "protobuf", request, "traces")
        except OTLPDecodeError as exc:
            raise RecordingError(f"{file}: not an OTLP ExportTraceServiceRequest ({exc})") from None
        yield request


def _spans(request: Any) -> Iterator[Any]:
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            yield from scope_spans.spans


@dataclass
class PreparedImport:
    """A recording read, checked and encoded, ready to post (:func:`prepare_import`):
    ``trace_bodies`` and ``metric_bodies`` are OTLP protobuf bodies with every time moved by
    ``offset_ns``; ``unrecognised_scrapes`` the times (unix ns, as recorded) of the scrapes
    whose metric names match no collector source, or none of the given source's catalog
    (they are not posted); ``start`` / ``end``
    as in :class:`ImportResult`, over what is posted."""

    trace_bodies: list[bytes]
    metric_bodies: list[bytes]
    scrapes: int
    unrecognised_scrapes: list[int]
    offset_ns: int
    source: str | None
    start: datetime | None
    end: datetime | None


def prepare_import(recording: Recording, *, offset_ns: int = 0, source: str | None = None) -> PreparedImport:
    """Read every file of ``recording``, check it and encode what will be posted, so that a
    bad file stops the import before anything reaches a store. ``source``: the collector
    source of the scrapes (default: recognised from each scrape). Raises
    :class:`RecordingError` naming the file (or the scrape's time) and what was wrong: an
    unknown ``source``, a body that is not an OTLP trace request, a scrape the collectors'
    parser refuses, or scrapes of which none is of a known source with no trace body beside."""
    from inferpath.collectors.otlp_export import build_request
    from inferpath.collectors.pipeline import parse_scrape
    from inferpath.vocabulary import SOURCES

    if source is not None and source not in SOURCES:
        raise RecordingError(f"source: unknown {source!r}, expected one of {', '.join(SOURCES)}")
    trace_bodies: list[bytes] = []
    span_range: list[int] = []
    for request in _trace_requests(recording):
        for span in _spans(request):
            if offset_ns:
                span.start_time_unix_nano += offset_ns
                span.end_time_unix_nano += offset_ns
                for event in span.events:
                    event.time_unix_nano += offset_ns
            span_range = (
                [min(span_range[0], span.start_time_unix_nano), max(span_range[1], span.end_time_unix_nano)]
                if span_range
                else [span.start_time_unix_nano, span.end_time_unix_nano]
            )
        trace_bodies.append(request.SerializeToString())
    seen_source = None
    unrecognised: list[int] = []
    posted_range: list[int] = []
    metric_bodies: list[bytes] = []
    pending: list[tuple[str, list]] = []
    for at_ns, text in recording.scrapes:
        kind = source or detect_source(text)
        if kind is None:
            unrecognised.append(at_ns)
            continue
        stamp = datetime.fromtimestamp((at_ns + offset_ns) // 1000 / 1e6, tz=timezone.utc)
        try:
            samples = parse_scrape(text, kind, timestamp=stamp).all()
        except ValueError as exc:
            raise RecordingError(f"scrape at {at_ns}: {exc}") from None
        if not samples:  # nothing of the source's catalog in it
            unrecognised.append(at_ns)
            continue
        seen_source = seen_source or kind
        posted_range = [min(posted_range[0], at_ns), max(posted_range[1], at_ns)] if posted_range else [at_ns, at_ns]
        pending.append((kind, samples))
        if len(pending) == SCRAPES_PER_BODY:
            metric_bodies.append(build_request(pending).SerializeToString())
            pending = []
    if pending:
        metric_bodies.append(build_request(pending).SerializeToString())
    if recording.scrapes and not metric_bodies and not trace_bodies:
        if source is not None:
            raise RecordingError(
                f"{recording.root}: none of the {len(recording.scrapes)} scrapes holds a metric that the "
                f"{source} collector reads"
            )
        prefixes = ", ".join(prefix for prefix, _ in SOURCE_PREFIXES)
        raise RecordingError(
            f"{recording.root}: none of the {len(recording.scrapes)} scrapes holds metrics of a known source "
            f"(names starting {prefixes}); give --source if they are one's under other names"
        )
    bounds = [*span_range, *(at + offset_ns for at in posted_range)]
    start = end = None
    if bounds:  # the end is exclusive in a window: one microsecond past the last time posted
        start = datetime.fromtimestamp(min(bounds) // 1000 / 1e6, tz=timezone.utc)
        end = datetime.fromtimestamp((max(bounds) // 1000 + 1) / 1e6, tz=timezone.utc)
    return PreparedImport(
        trace_bodies,
        metric_bodies,
        len(recording.scrapes) - len(unrecognised),
        unrecognised,
        offset_ns,
        seen_source,
        start,
        end,
    )


def post_import(prepared: PreparedImport, client: httpx.Client, *, flush: bool = True) -> ImportResult:
    """Post ``prepared`` to the inferpath server behind ``client`` (traces first), then flush
    it so it is readable (``flush=False``: the caller flushes once after several imports;
    ``flushed`` is then False). Raises :class:`RecordingError` when the server refuses a body
    (its answer is quoted) or is not an inferpath server."""
    for body in prepared.trace_bodies:
        _post(client, "/v1/traces", body, "trace body")
    for body in prepared.metric_bodies:
        _post(client, "/v1/metrics", body, "scrape")
    flushed = flush and client.post("/api/v1/flush", params={"timeout_seconds": 120}).json().get("ok") is True
    return ImportResult(
        prepared.scrapes,
        len(prepared.trace_bodies),
        prepared.offset_ns,
        prepared.source,
        prepared.start,
        prepared.end,
        flushed,
    )


def import_recording(
    recording: Recording, client: httpx.Client, *, offset_ns: int = 0, source: str | None = None, flush: bool = True
) -> ImportResult:
    """:func:`prepare_import` then :func:`post_import`: a bad file or option raises
    :class:`RecordingError` before anything is posted."""
    return post_import(prepare_import(recording, offset_ns=offset_ns, source=source), client, flush=flush)


# How long one body may be refused as "busy" (503/429) before the import gives up: the
# server's span log drains a full backlog (16 MiB) in seconds.
BUSY_RETRY_SECONDS = 300.0


def _post(client: httpx.Client, path: str, body: bytes, what: str) -> None:
    """POST one OTLP body; a 503 or 429 is waited out as its ``Retry-After`` says (1 s when
    absent), for at most :data:`BUSY_RETRY_SECONDS` in all. Raises :class:`RecordingError`."""
    deadline = time.monotonic() + BUSY_RETRY_SECONDS
    while True:
        response = client.post(path, content=body, headers=PROTOBUF)
        if response.status_code not in (429, 503) or time.monotonic() >= deadline:
            break
        wait = retry_after_seconds(response.headers.get("Retry-After"))
        time.sleep(min(1.0 if wait is None else max(wait, 0.1), max(0.0, deadline - time.monotonic())))
    if response.status_code in (404, 405, 501):  # an inferpath server has both OTLP routes, for POST
        raise RecordingError(
            f"{client.base_url} is not an inferpath server: it answered POST {path} with {response.status_code} "
            f"{response.reason_phrase}; give --server the address `inferpath up` printed"
        )
    if response.status_code != 200:
        busy = f" for {BUSY_RETRY_SECONDS:g} s" if response.status_code in (429, 503) else ""
        raise RecordingError(
            f"the server refused a {what}{busy} ({response.status_code} {response.reason_phrase}): "
            f"{_refusal_message(response)}"
        )


def _refusal_message(response: httpx.Response) -> str:
    """The message of an OTLP/HTTP error body (``google.rpc.Status``, protobuf or JSON), else
    the body's first 300 characters."""
    if response.headers.get("content-type", "").startswith("application/x-protobuf"):
        try:
            return status_pb2.Status.FromString(response.content).message[:300]
        except DecodeError:
            pass
    try:
        document = response.json()
    except ValueError:
        return response.text[:300]
    message = document.get("message") if isinstance(document, dict) else None
    return str(message)[:300] if message else response.text[:300]


__all__ = [
    "ImportResult",
    "PreparedImport",
    "Recording",
    "RecordingError",
    "SCRAPES_PER_BODY",
    "SOURCE_PREFIXES",
    "choose_offset_ns",
    "detect_source",
    "import_recording",
    "open_recording",
    "post_import",
    "prepare_import",
]
