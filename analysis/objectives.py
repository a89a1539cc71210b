"""Latency objectives per endpoint class, and whether a window meets them.

An objective is an upper bound on a percentile of a per-request measure, per endpoint class
(``interactive`` / ``bulk``, DESIGN.md §3): the right latency differs between a chat user and
an offline batch job, so one threshold for both would be wrong for one of them. A window is
*healthy* when every class in it meets its objectives and its tail does not diverge from its
average (:func:`tail_diverges`).

Defaults (:data:`DEFAULT_OBJECTIVES`), chosen from what interactive products commit to and
what the guidance's worked example uses:

| class | TTFT p99 | ITL p99 | E2E p99 |
|---|---|---|---|
| interactive | 1 s | 100 ms | — |
| bulk | 10 s | 500 ms | — |

A class not named (e.g. rows with no class) takes the ``interactive`` objectives: an
unclassified endpoint is judged by the stricter goal rather than not at all.

Override in a YAML file (``INFERPATH_OBJECTIVES_FILE``, ``inferpath diagnose --objectives``)::

    interactive: {ttft_p99_seconds: 0.6, itl_p99_seconds: 0.05}
    bulk: {ttft_p99_seconds: 30}

or on the command line (``--ttft-p99 0.6`` for every class). Durations are seconds in the
file and in flags, nanoseconds inside (:attr:`Objective.limit_ns`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferpath.vocabulary import DEFAULT_ENDPOINT_CLASS, OBJECTIVE_MEASURES

DEFAULT_CLASS = DEFAULT_ENDPOINT_CLASS
"""The class whose objectives apply to rows without a class, or of a class not configured."""
TAIL_DIVERGENCE_RATIO = 5.0
"""p99 / mean at or above which the tail diverges: the slowest 1% then wait five times the
typical request, far past the 2-3x that service-time variation alone gives (prompt and
output lengths vary by an order of magnitude in the Azure and Mooncake traces, and a p99 of
a healthy continuously batching engine stays within ~3x of its mean TTFT)."""
TAIL_DIVERGENCE_MIN_SHARE = 0.5
"""...and only when the p99 uses at least half of its objective: a 5 ms mean with a 40 ms
p99 against a 1 s objective diverges on paper and costs no user anything."""


@dataclass(frozen=True)
class Objective:
    """``measure`` (``ttft``, ``itl`` or ``e2e``) at quantile ``quantile`` must stay ≤
    ``limit_seconds``. Raises ``ValueError`` for an unknown measure, a quantile outside
    (0, 1) or a limit that is not a positive finite number."""

    measure: str
    limit_seconds: float
    quantile: float = 0.99

    def __post_init__(self) -> None:
        if self.measure not in OBJECTIVE_MEASURES:
            raise ValueError(f"objective measure must be one of {OBJECTIVE_MEASURES}, got {self.measure!r}")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"objective quantile must be in (0, 1), got {self.quantile!r}")
        if (
            isinstance(self.limit_seconds, bool)
            or not isinstance(self.limit_seconds, (int, float))
            or not math.isfinite(self.limit_seconds)
            or self.limit_seconds <= 0
        ):
            raise ValueError(
                f"{self.measure} objective must be a positive number of seconds, got {self.limit_seconds!r}"
            )

    @property
    def limit_ns(self) -> float:
        """The limit in nanoseconds."""
        return self.limit_seconds * 1e9

    @property
    def name(self) -> str:
        """``ttft_p99`` and so on."""
        return f"{self.measure}_p{self.quantile * 100:g}"


@dataclass(frozen=True)
class Objectives:
    """Objectives per endpoint class: ``by_class`` maps a class name to its objectives."""

    by_class: Mapping[str, tuple[Objective, ...]] = field(default_factory=dict)

    def for_class(self, endpoint_class: str | None) -> tuple[Objective, ...]:
        """The objectives of ``endpoint_class``; those of :data:`DEFAULT_CLASS` for an
        unknown or empty class."""
        if endpoint_class and endpoint_class in self.by_class:
            return self.by_class[endpoint_class]
        return self.by_class.get(DEFAULT_CLASS, ())

    def with_limit(self, measure: str, limit_seconds: float) -> Objectives:
        """A copy where every class's p99 ``measure`` objective is ``limit_seconds`` (added
        where absent): what ``--ttft-p99 0.6`` means."""
        changed = {}
        for name, objectives in self.by_class.items():
            kept = tuple(o for o in objectives if not (o.measure == measure and o.quantile == 0.99))
            changed[name] = (*kept, Objective(measure, float(limit_seconds)))
        return Objectives(changed)


DEFAULT_OBJECTIVES = Objectives(
    {
        "interactive": (Objective("ttft", 1.0), Objective("itl", 0.1)),
        "bulk": (Objective("ttft", 10.0), Objective("itl", 0.5)),
    }
)
"""The documented defaults (module docstring table)."""


def objectives_from_mapping(data: Any, *, origin: str = "objectives") -> Objectives:
    """Parse ``{class: {"<measure>_p<q>_seconds": limit, ...}, ...}`` (the YAML file's shape)
    over :data:`DEFAULT_OBJECTIVES`: a class named in ``data`` replaces the matching
    objectives of that class and keeps the others. Keys: ``ttft_p99_seconds``,
    ``itl_p90_seconds``, ... Raises ``ValueError`` naming ``origin`` and the bad key or value."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{origin}: expected a mapping of endpoint class to objectives, got {type(data).__name__}")
    by_class = dict(DEFAULT_OBJECTIVES.by_class)
    for class_name, entries in data.items():
        if not isinstance(class_name, str) or not class_name:
            raise ValueError(f"{origin}: endpoint class names must be non-empty strings, got {class_name!r}")
        if not isinstance(entries, Mapping):
            raise ValueError(
                f"{origin}: {class_name}: expected a mapping like {{ttft_p99_seconds: 1.0}}, got {entries!r}"
            )
        parsed = []
        for key, value in entries.items():
            parsed.append(_objective_of_key(str(key), value, f"{origin}: {class_name}.{key}"))
        replaced = {(o.measure, o.quantile) for o in parsed}
        kept = tuple(o for o in by_class.get(class_name, ()) if (o.measure, o.quantile) not in replaced)
        by_class[class_name] = (*kept, *parsed)
    return Objectives(by_class)


def _objective_of_key(key: str, value: Any, where: str) -> Objective:
    parts = key.split("_")
    if len(parts) != 3 or parts[2] != "seconds" or parts[0] not in OBJECTIVE_MEASURES or not parts[1].startswith("p"):
        raise ValueError(
            f"{where}: unknown objective; use <measure>_p<percentile>_seconds with a measure "
            f"in {OBJECTIVE_MEASURES}, e.g. ttft_p99_seconds"
        )
    try:
        quantile = float(parts[1][1:]) / 100.0
    except ValueError:
        raise ValueError(f"{where}: the percentile {parts[1]!r} is not a number") from None
    try:
        return Objective(parts[0], value, quantile)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_objectives(path: str | Path | None) -> Objectives:
    """:data:`DEFAULT_OBJECTIVES`, overridden by the YAML file at ``path`` when given.
    Raises ``ValueError`` naming the file for a missing, unreadable, malformed or empty file."""
    if path is None or str(path) == "":
        return DEFAULT_OBJECTIVES
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"objectives file {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"objectives file {path}: not valid YAML ({exc})") from None
    if data is None or data == {}:
        # A file given and read as nothing is a mistake (a wrong file, or one cut short), not
        # a wish for the defaults: those need no file.
        raise ValueError(
            f"objectives file {path}: holds no objectives; write at least one, e.g. "
            "'interactive: {ttft_p99_seconds: 1.0}', or leave the option out for the defaults"
        )
    return objectives_from_mapping(data, origin=f"objectives file {path}")


# ---------------------------------------------------------------------------- judging a window


@dataclass(frozen=True)
class ObjectiveResult:
    """One objective judged on one endpoint class of a window.

    ``value_ns``: the measured quantile (``None`` when no request of the class has the
    measure); ``met``: ``value_ns ≤ limit``, ``None`` when not measured; ``requests``: rows
    of the class with the measure."""

    endpoint_class: str
    measure: str
    quantile: float
    limit_ns: float
    value_ns: float | None
    requests: int
    met: bool | None

    @property
    def over_ns(self) -> float:
        """How far over the limit (ns), 0 when met or not measured."""
        return max(0.0, (self.value_ns or 0.0) - self.limit_ns) if self.met is False else 0.0


@dataclass(frozen=True)
class TailResult:
    """p99 against the mean of one measure in one class: ``diverged`` per
    :func:`tail_diverges`."""

    endpoint_class: str
    measure: str
    mean_ns: float
    p99_ns: float
    ratio: float
    diverged: bool


def tail_diverges(p99_ns: float, mean_ns: float, limit_ns: float | None) -> bool:
    """The tail diverges from the average: p99 ≥ :data:`TAIL_DIVERGENCE_RATIO` × mean and,
    when the measure has an objective, p99 ≥ :data:`TAIL_DIVERGENCE_MIN_SHARE` of it."""
    if mean_ns <= 0 or p99_ns < TAIL_DIVERGENCE_RATIO * mean_ns:
        return False
    return limit_ns is None or p99_ns >= TAIL_DIVERGENCE_MIN_SHARE * limit_ns


def class_values(rows: Iterable[Mapping[str, Any]], measure: str) -> dict[str, list[float]]:
    """Endpoint class → sorted values of ``<measure>_ns`` (rows without it skipped)."""
    out: dict[str, list[float]] = {}
    for row in rows:
        value = row.get(f"{measure}_ns")
        if value is not None:
            out.setdefault(str(row.get("endpoint_class") or ""), []).append(float(value))
    for values in out.values():
        values.sort()
    return out


__all__ = [
    "DEFAULT_CLASS",
    "DEFAULT_OBJECTIVES",
    "TAIL_DIVERGENCE_MIN_SHARE",
    "TAIL_DIVERGENCE_RATIO",
    "Objective",
    "ObjectiveResult",
    "Objectives",
    "TailResult",
    "class_values",
    "load_objectives",
    "objectives_from_mapping",
    "tail_diverges",
]
