"""Alert rule files (YAML): the models, and a loader whose errors name file, line and field.

A rule file holds ``evaluation_interval``, optional ``query_offset``, ``receivers`` and
``rules``. Each rule has a ``kind`` that fixes which query it runs (see
:mod:`inferpath.alerts.queries`) and which parameters it takes; the shared fields follow
Prometheus alerting rules (``for``, ``keep_firing_for``, ``labels``, ``annotations``).
Durations are Prometheus-style strings (``90s``, ``5m``, ``1h30m``) or numbers of seconds.

Example::

    evaluation_interval: 15s
    rules:
      - name: TTFTTailDivergence
        kind: tail_divergence
        endpoint_class: interactive
        measure: ttft
        ratio_threshold: 4
        min_samples: 200
        window: 5m
        for: 2m
        annotations:
          summary: "TTFT p99 is {{ value }}x the mean"
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from inferpath.alerts.templates import check_templates
from inferpath.timespec import parse_duration_seconds
from inferpath.vocabulary import (
    GPU_UP,
    GPU_UTILIZATION_RATIO,
    KV_CACHE_USAGE_RATIO,
    QUEUE_DEPTH,
    REQUEST_MEASURES,
)

__all__ = [
    "RuleFileError",
    "RuleFile",
    "Rule",
    "Receiver",
    "load_rule_file",
    "parse_rule_text",
    "DEFAULT_RULES_PATH",
    "GROUP_BY_COLUMNS",
]

DEFAULT_RULES_PATH = Path(__file__).resolve().parent / "rules" / "default.yaml"

GROUP_BY_COLUMNS: tuple[str, ...] = ("endpoint", "endpoint_class", "model", "replica", "service_name")
"""Columns of ``inferpath_requests`` a request rule may split its alerts by (``by:``)."""

_RULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


Seconds = Annotated[float, BeforeValidator(parse_duration_seconds)]
PositiveSeconds = Annotated[float, BeforeValidator(parse_duration_seconds), Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Receiver(_Strict):
    """Where notifications go.

    ``type``: ``alertmanager`` (POST ``{url}/api/v2/alerts``, Alertmanager's API v2 body),
    ``webhook`` (POST ``url`` with a generic JSON body, Alertmanager-webhook-like) or ``log``.
    ``timeout``: per attempt; ``max_attempts``: tries before a notification is dropped
    (counted); ``backoff_initial``/``backoff_max``: exponential backoff between tries.
    ``resend_interval`` (alertmanager only, default 1m): firing alerts are re-sent this often
    with ``endsAt`` four intervals ahead, as Prometheus does, so Alertmanager does not resolve
    them on its own; Alertmanager deduplicates, so people are notified once.
    """

    name: str
    type: Literal["alertmanager", "webhook", "log"]
    url: str | None = None
    timeout: PositiveSeconds = 5.0
    max_attempts: int = Field(5, ge=1, le=100)
    backoff_initial: PositiveSeconds = 0.5
    backoff_max: PositiveSeconds = 30.0
    resend_interval: PositiveSeconds = 60.0
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _url_needed(self) -> Receiver:
        if self.type != "log":
            if not self.url:
                raise ValueError(f"url is required for a receiver of type {self.type}")
            if not self.url.startswith(("http://", "https://")):
                raise ValueError("url must start with http:// or https://")
        return self


class _RuleBase(_Strict):
    """Fields every rule has (Prometheus alerting-rule semantics).

    ``window``: the range each evaluation looks back over. ``for_``: how long the condition
    must hold before the alert fires (pending until then; YAML key ``for``).
    ``keep_firing_for``: how long a firing alert stays firing after the condition stops.
    ``endpoint_class``: restrict request rules to one class (``None``: all classes).
    ``evidence_keys`` (per kind, not a field): the names its query puts in a sample's
    evidence, which annotations may use as ``{{ evidence.NAME }}``.
    """

    evidence_keys: ClassVar[tuple[str, ...]] = ()

    name: str
    window: PositiveSeconds = 300.0
    for_: Seconds = Field(0.0, alias="for")
    keep_firing_for: Seconds = 0.0
    endpoint_class: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RULE_NAME.match(value):
            raise ValueError("must be letters, digits and underscores, not starting with a digit")
        return value

    @field_validator("labels", "annotations")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _LABEL_NAME.match(key):
                raise ValueError(f"label/annotation name {key!r} must be letters, digits and underscores")
        return value


class _RequestRule(_RuleBase):
    """A rule over request rows: ``measure``, one of the vocabulary's
    :data:`~inferpath.vocabulary.REQUEST_MEASURES` (the ``<measure>_ns`` column; ``ttft``
    and ``e2e`` by :data:`~inferpath.vocabulary.CLIENT_FIRST_SQL`: the client's, else the server's);
    ``min_samples`` below which it reports low confidence and never fires; ``by``: columns
    to split alerts by (one alert per distinct value)."""

    measure: Literal[REQUEST_MEASURES] = "ttft"  # type: ignore[valid-type]
    min_samples: int = Field(100, ge=1)
    by: list[Literal[GROUP_BY_COLUMNS]] = Field(default_factory=list)  # type: ignore[valid-type]


class TailDivergenceRule(_RequestRule):
    """Fires when ``quantile(measure) / mean(measure) ≥ ratio_threshold`` and the quantile is
    at least ``min_tail_seconds``: the tail has left the average behind."""

    kind: Literal["tail_divergence"]
    evidence_keys = ("samples", "mean_seconds", "quantile_seconds", "quantile", "ratio", "window_seconds")
    quantile: float = Field(0.99, gt=0, lt=1)
    ratio_threshold: float = Field(gt=1)
    min_tail_seconds: float = Field(0.0, ge=0)


class QuantileOverSloRule(_RequestRule):
    """Fires when ``quantile(measure) > slo_seconds``."""

    kind: Literal["quantile_over_slo"]
    evidence_keys = ("samples", "quantile_seconds", "quantile", "slo_seconds", "window_seconds")
    quantile: float = Field(0.99, gt=0, lt=1)
    slo_seconds: float = Field(gt=0)


class ErrorRateRule(_RequestRule):
    """Fires when the share of requests whose status is in ``statuses`` is ≥ ``threshold_ratio``."""

    kind: Literal["error_rate"]
    evidence_keys = ("samples", "errors", "error_ratio", "window_seconds")
    measure: Literal["ttft"] = "ttft"  # unused: error rate counts rows
    threshold_ratio: float = Field(gt=0, le=1)
    statuses: list[str] = Field(default_factory=lambda: ["error", "incomplete"], min_length=1)


class QueueGrowingRule(_RuleBase):
    """Fires when the summed ``queue_depth`` grows by ≥ ``min_increase`` over the window (least-
    squares slope × window, like PromQL ``deriv``) and its latest value is ≥ ``min_depth``."""

    kind: Literal["queue_growing"]
    evidence_keys = ("samples", QUEUE_DEPTH, "increase", "slope_per_second", "window_seconds")
    min_increase: float = Field(gt=0)
    min_depth: float = Field(1.0, ge=0)
    min_samples: int = Field(5, ge=2)


class KvPressureRule(_RuleBase):
    """Fires when the fullest engine's ``kv_cache_usage_ratio`` over the window, at its p90
    (``queries.KV_USAGE_QUANTILE``: idle scrapes do not hide a full pool), is ≥
    ``usage_threshold`` and ``preemptions_total`` increased by ≥ ``min_preemptions``."""

    kind: Literal["kv_pressure"]
    evidence_keys = ("samples", KV_CACHE_USAGE_RATIO, "preemptions", "window_seconds")
    usage_threshold: float = Field(0.9, gt=0, le=1)
    min_preemptions: float = Field(1.0, gt=0)
    min_samples: int = Field(3, ge=1)


class IdleGpuLatencyRule(_RequestRule):
    """Fires when ``quantile(measure) > slo_seconds`` while mean ``gpu_utilization_ratio`` is
    below ``idle_threshold``: latency that more GPUs would not fix. A window without
    utilization samples (device cannot report it) never fires: the rule says "unknown"."""

    kind: Literal["idle_gpu_latency"]
    evidence_keys = (
        "samples",
        "quantile_seconds",
        "quantile",
        "slo_seconds",
        GPU_UTILIZATION_RATIO,
        "utilization_samples",
        "window_seconds",
    )
    quantile: float = Field(0.99, gt=0, lt=1)
    slo_seconds: float = Field(gt=0)
    idle_threshold: float = Field(0.3, gt=0, le=1)
    min_utilization_samples: int = Field(3, ge=1)


class GpuLostRule(_RuleBase):
    """Fires for each GPU (host, ``UUID``, MIG ``GPU_I_ID``) whose latest ``gpu_up`` sample in
    the window is 0: its collector can no longer read it (NVML ``GPU_IS_LOST``, a GPU that no
    longer enumerates, or the driver gone). One alert per GPU, labelled ``host``, ``UUID``,
    ``gpu`` (index) and ``GPU_I_ID`` for a MIG instance. A window without ``gpu_up`` samples
    (no NVML collector) is ``unknown``, never "fine"."""

    kind: Literal["gpu_lost"]
    evidence_keys = ("samples", GPU_UP, "gpu", "model", "window_seconds")
    window: PositiveSeconds = 120.0


Rule = Annotated[
    TailDivergenceRule
    | QuantileOverSloRule
    | ErrorRateRule
    | QueueGrowingRule
    | KvPressureRule
    | IdleGpuLatencyRule
    | GpuLostRule,
    Field(discriminator="kind"),
]


class RuleFile(_Strict):
    """A whole rule file: ``evaluation_interval`` (default 15s), ``query_offset`` (evaluate
    ``now - query_offset``, leaving time for late rows; default 0), ``receivers``, ``rules``.
    Rule names must be unique; so must receiver names."""

    evaluation_interval: PositiveSeconds = 15.0
    query_offset: Seconds = 0.0
    receivers: list[Receiver] = Field(default_factory=list)
    rules: list[Rule] = Field(default_factory=list)

    @field_validator("rules")
    @classmethod
    def _unique_rules(cls, rules: list[Any]) -> list[Any]:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}")
            seen.add(rule.name)
        return rules

    @field_validator("receivers")
    @classmethod
    def _unique_receivers(cls, receivers: list[Receiver]) -> list[Receiver]:
        names = [r.name for r in receivers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"two receivers are named {duplicates[0]!r}")
        return receivers


class RuleFileError(ValueError):
    """A rule file that cannot be used. ``problems``: ``(line, field, message)`` tuples
    (line 1-based, ``None`` when unknown; field ``"(file)"`` for the file as a whole);
    ``str()`` gives one ``file:line: field: message`` line per problem (``file: message``
    for the file as a whole)."""

    def __init__(self, source: str, problems: list[tuple[int | None, str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [
            f"{source}:{line}: {field}: {message}"
            if line is not None
            else f"{source}: {message}"
            if field == "(file)"
            else f"{source}: {field}: {message}"
            for line, field, message in problems
        ]
        super().__init__("\n".join(lines))


def _node_line(root: yaml.Node | None, loc: tuple[Any, ...]) -> tuple[int | None, str]:
    """Line of the deepest YAML node on ``loc`` and the dotted field path it names.

    Parts of ``loc`` that are not keys (pydantic adds the union tag, e.g. ``tail_divergence``)
    are skipped, so the path names what the user wrote.
    """
    node, line, path = root, (root.start_mark.line + 1 if root is not None else None), []
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            key = "for" if part == "for_" else part
            for key_node, value_node in node.value:
                if key_node.value == key:
                    path.append(str(key))
                    node, line = value_node, key_node.start_mark.line + 1
                    break
            else:
                if isinstance(part, str) and part not in _TAGS:
                    path.append(str(key))
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            path.append(f"[{part}]")
            node = node.value[part]
            line = node.start_mark.line + 1
    return line, ".".join(path).replace(".[", "[") or "(file)"


_TAGS = {
    "tail_divergence",
    "quantile_over_slo",
    "error_rate",
    "queue_growing",
    "kv_pressure",
    "idle_gpu_latency",
    "gpu_lost",
}


def parse_rule_text(text: str, source: str = "<rules>") -> RuleFile:
    """Parse and validate rule-file YAML ``text``; ``source`` names it in errors.

    Raises :class:`RuleFileError` listing every problem with its line and field.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # The construct that is open (context) is where the user must look; the problem mark
        # is often the end of the file.
        mark = getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        context = getattr(exc, "context", None)
        problem = getattr(exc, "problem", None) or str(exc)
        message = f"not valid YAML: {context + ': ' if context else ''}{problem}"
        raise RuleFileError(source, [(line, "(file)", message)]) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RuleFileError(source, [(1, "(file)", "the file must be a mapping with a 'rules' list")])
    try:
        rule_file = RuleFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
                loc += ("kind",)  # pydantic reports a bad tag at the rule; the user wrote it at kind
            line, field = _node_line(root, loc)
            message = error["msg"].removeprefix("Value error, ")
            problems.append((line, field, message))
        raise RuleFileError(source, problems) from exc
    template_problems = check_templates(rule_file)
    if template_problems:
        raise RuleFileError(source, [(*_node_line(root, loc), message) for loc, message in template_problems])
    return rule_file


def load_rule_file(path: str | Path) -> RuleFile:
    """Read and validate the rule file at ``path`` (``"default"``: the shipped pack).

    Raises :class:`RuleFileError` (also for an unreadable file) naming file, line and field.
    """
    file_path = DEFAULT_RULES_PATH if str(path) == "default" else Path(path)
    try:
        text = file_path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RuleFileError(str(file_path), [(None, "(file)", f"cannot read: {exc.strerror or exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise RuleFileError(
            str(file_path),
            [(None, "(file)", f"not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start}")],
        ) from exc
    return parse_rule_text(text, str(file_path))
