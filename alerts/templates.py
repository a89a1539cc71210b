"""Annotation templates: ``{{ value }}``, ``{{ labels.NAME }}``, ``{{ evidence.NAME }}``,
``{{ reason }}``, ``{{ diagnosis }}``, each with an optional filter ``| ms``, ``| percent``
or ``| round``.

Deliberately not a template language: only these names can be read, nothing is evaluated,
so a rule file cannot run code. Names are checked when the file loads (an unknown evidence
name is an error naming its line). A missing value renders as ``n/a``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["render", "check_templates", "TEMPLATE_NAMES"]

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(?:\|\s*([a-z]+)\s*)?\}\}")
_FILTERS = ("ms", "percent", "round")
TEMPLATE_NAMES = ("value", "reason", "diagnosis", "labels.<name>", "evidence.<name>")


def _format(value: Any, filter_name: str | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if filter_name == "ms":
            return f"{value * 1e3:.1f} ms"
        if filter_name == "percent":
            return f"{value * 100:.1f}%"
        if filter_name == "round":
            return f"{value:.0f}"
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return str(value)


def render(
    template: str,
    *,
    value: float | None,
    labels: Mapping[str, str],
    evidence: Mapping[str, Any],
    reason: str = "",
    diagnosis: str = "",
) -> str:
    """Fill ``template``'s placeholders; unknown names render as ``n/a`` (checked at load)."""

    def fill(match: re.Match[str]) -> str:
        name, filter_name = match.group(1), match.group(2)
        if name == "value":
            return _format(value, filter_name)
        if name == "reason":
            return reason
        if name == "diagnosis":
            return diagnosis or "n/a"
        scope, _, key = name.partition(".")
        if scope == "labels":
            return str(labels.get(key, "")) or "n/a"
        if scope == "evidence":
            return _format(evidence.get(key), filter_name)
        return "n/a"

    return _PLACEHOLDER.sub(fill, template)


def uses_diagnosis(annotations: Mapping[str, str]) -> bool:
    """True when any annotation asks for ``{{ diagnosis }}`` (computing it costs queries)."""
    return any(match.group(1) == "diagnosis" for text in annotations.values() for match in _PLACEHOLDER.finditer(text))


def check_templates(rule_file: Any) -> list[tuple[tuple, str]]:
    """Problems in the annotation templates of ``rule_file`` (a
    :class:`~inferpath.alerts.rules.RuleFile`; each rule's kind names its ``evidence_keys``):
    ``(loc, message)`` pairs, ``loc`` as pydantic's (``("rules", 0, "annotations", "summary")``)."""
    problems = []
    for index, rule in enumerate(rule_file.rules):
        for key, text in rule.annotations.items():
            loc = ("rules", index, "annotations", key)
            if text.count("{{") != len(_PLACEHOLDER.findall(text)):
                problems.append((loc, "malformed placeholder: use {{ name }} or {{ name | ms }}"))
                continue
            for match in _PLACEHOLDER.finditer(text):
                name, filter_name = match.group(1), match.group(2)
                scope, dot, field = name.partition(".")
                if filter_name is not None and filter_name not in _FILTERS:
                    problems.append((loc, f"unknown filter {filter_name!r}; use one of {', '.join(_FILTERS)}"))
                elif name in ("value", "reason", "diagnosis") or (scope == "labels" and dot and field):
                    continue
                elif scope == "evidence" and field in rule.evidence_keys:
                    continue
                elif scope == "evidence":
                    problems.append(
                        (loc, f"kind {rule.kind} has no evidence {field!r}; it has {', '.join(rule.evidence_keys)}")
                    )
                else:
                    problems.append((loc, f"unknown template name {name!r}; use one of {', '.join(TEMPLATE_NAMES)}"))
    return problems
