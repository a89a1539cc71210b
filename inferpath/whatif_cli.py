"""``inferpath whatif``: what a configuration change would do to TTFT, from a stored window.

It asks a server's ``GET /api/v1/whatif`` (the one at ``--server``, or one started in this
process over ``--store``, as ``diagnose`` does) and prints, per endpoint class, the observed
figures, the replay of the observed configuration (how far the model can be trusted) and
the prediction. Exit 0 with a prediction, 2 without one: a bad input (the message starts with
its option, ``--rate: at most x1000, got 'x5000'``; checked before anything is read, except
a replay of more than 1,000,000 requests, which only the window tells), no server, or a
refusal of the question (``no prediction: ...``: a window that cannot be calibrated, or a
replay off by more than the limit, 30 % by default).
"""

from __future__ import annotations

import json
from typing import Any

import typer

from inferpath.server_access import ask, console, fail, refusal_text
from inferpath.vocabulary import UNCLASSIFIED

OPTIONS = {
    "start": "--from",
    "end": "--to",
    "replicas": "--replicas",
    "max_num_seqs": "--max-num-seqs",
    "kv_blocks": "--kv-blocks",
    "batch_window_ms": "--batch-window-ms",
    "rate": "--rate",
    "split_endpoint_classes": "--split-endpoint-classes",
    "max_calibration_error": "--max-calibration-error",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "step_token_budget": "--step-token-budget",
}
"""The read API's parameters of ``GET /api/v1/whatif`` → this command's options: how its
messages name an input (:data:`inferpath.analysis.whatif.API_NAMES`)."""


def whatif(
    from_: str = typer.Option(..., "--from", help="Window start: ISO-8601 with offset, -30m, now or Unix seconds."),
    to: str | None = typer.Option(None, "--to", help="Window end (default now)."),
    replicas: int | None = typer.Option(
        None, "--replicas", help="Engines behind a round-robin gateway: an integer, 1 to 1024."
    ),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", help="Batch slots per engine: an integer, 1 to 65536."
    ),
    kv_blocks: str | None = typer.Option(
        None,
        "--kv-blocks",
        help="KV blocks per engine: a count N (96, at least 1) or a factor xK or ×K of the calibrated pool "
        "(x2; above 0, at most 1000).",
    ),
    batch_window_ms: float | None = typer.Option(
        None, "--batch-window-ms", help="Hold the queue head this long for more requests: 0 to 60000 ms."
    ),
    rate: str | None = typer.Option(
        None,
        "--rate",
        help="Arrival rate factor xK, ×K or K (x2: the window's pattern twice as dense); above 0, at most 1000. "
        "A replay simulates at most 1,000,000 requests (the window's requests times K): more is refused.",
    ),
    split_endpoint_classes: str | None = typer.Option(
        None,
        "--split-endpoint-classes",
        help="Each endpoint class on engines of its own: CLASS=REPLICAS,... "
        "e.g. interactive=2,bulk=1 (predicted per class; at most 1024 replicas in all).",
    ),
    max_calibration_error: float = typer.Option(
        0.30, "--max-calibration-error", min=0.01, help="Refuse when the replay is off by more than this."
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        min=1,
        max=1_048_576,
        help="The observed engine's prompt-token budget per step as configured (vLLM's --max-num-batched-tokens; "
        "engines do not export it). Default 2048, vLLM's default for its OpenAI server.",
    ),
    step_token_budget: int | None = typer.Option(
        None,
        "--step-token-budget",
        min=1,
        max=1_048_576,
        help="The change: a per-step token budget to predict, in tokens (e.g. 8192; vLLM's "
        "--max-num-batched-tokens). Give the engine's current one with --max-num-batched-tokens.",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
    server: str | None = typer.Option(None, help="inferpath server URL (default INFERPATH_SERVER_URL)."),
    store: str | None = typer.Option(None, help="Read this store directly (chdb:///path or http://host:8123/db)."),
) -> None:
    """Predict TTFT p50/p99, queue time, ITL and KV usage per endpoint class under a changed
    configuration, replaying the window through the engine model calibrated on it. Exit 0
    with a prediction, 2 without."""
    from datetime import datetime, timezone

    from inferpath.timespec import command_window

    try:
        start, end = command_window(since=None, from_=from_, to=to, default_since="15m", now=datetime.now(timezone.utc))
    except ValueError as exc:
        fail(str(exc), json_output)
        raise
    from inferpath.analysis.whatif import WhatIfInputError, parse_change

    try:  # checked here too, so a bad value is said at once and by its option's name
        parse_change(
            replicas=replicas,
            max_num_seqs=max_num_seqs,
            kv_blocks=kv_blocks,
            batch_window_ms=batch_window_ms,
            rate=rate,
            split_endpoint_classes=split_endpoint_classes,
            step_token_budget=step_token_budget,
        )
    except WhatIfInputError as exc:
        fail(exc.text(OPTIONS), json_output)
    params: dict[str, Any] = {
        "start": start.isoformat(),
        "end": end.isoformat(),
        "max_calibration_error": max_calibration_error,
    }
    for name, value in (
        ("replicas", replicas),
        ("max_num_seqs", max_num_seqs),
        ("kv_blocks", kv_blocks),
        ("batch_window_ms", batch_window_ms),
        ("rate", rate),
        ("split_endpoint_classes", split_endpoint_classes),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("step_token_budget", step_token_budget),
    ):
        if value is not None:
            params[name] = value
    response = ask("GET", "/api/v1/whatif", server, store, json_output, params=params, timeout_seconds=300.0)
    if response.status_code != 200:
        fail(refusal_for_cli(response), json_output, http_status=response.status_code)
    answer = response.json()
    if json_output:
        print(json.dumps(answer, indent=2))
    else:
        print_whatif(answer)


def refusal_for_cli(response: Any) -> str:
    """The server's refusal (an ``httpx.Response``) in this command's words: each 422 entry
    from its ``ctx.template`` with the options named as :data:`OPTIONS` says, else its message
    after the option of its ``loc``; another status's text as ``no prediction: ...``."""
    from inferpath.analysis.whatif import NO_PREDICTION

    detail = None
    if response.status_code == 422:
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            detail = None
    if not isinstance(detail, list) or not detail:
        message = refusal_text(response)
        return message if message.startswith(f"{NO_PREDICTION}:") else f"{NO_PREDICTION}: {message}"
    said = []
    for entry in detail:
        entry = entry if isinstance(entry, dict) else {"msg": str(entry)}
        template = (entry.get("ctx") or {}).get("template")
        if isinstance(template, str):
            try:
                said.append(template.format_map(OPTIONS))
                continue
            except (KeyError, ValueError, IndexError):
                pass
        message = str(entry.get("msg", ""))
        loc = entry.get("loc") or []
        param = str(loc[-1]) if loc else ""
        if message.startswith(f"{param}: "):
            message = message[len(param) + 2 :]
        said.append(f"{OPTIONS[param]}: {message}" if param in OPTIONS else message)
    return "; ".join(said)


def _s(value: float | None) -> str:
    return "-" if value is None else (f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def print_whatif(answer: dict[str, Any]) -> None:
    """The answer for a person: the change, the calibration's error, one table per class."""
    from rich.table import Table

    from inferpath.analysis.whatif import AGREEMENT_FLOORS

    console.print(f"[bold]what if: {answer['change_text']}[/]", highlight=False)
    worst = answer.get("max_calibration_error") or 0.0
    seen = [
        (cls.get(key), floor) for cls in answer.get("observed", {}).values() for key, floor in AGREEMENT_FLOORS.items()
    ]
    floored = any(value is not None and value < floor for value, floor in seen)
    console.print(
        f"replay of the observed configuration: within {worst * 100:.0f}% of what was observed"
        + (
            f" (TTFT figures both under {AGREEMENT_FLOORS['ttft_p50_seconds'] * 1000:.0f} ms, mean queue times "
            f"both under {AGREEMENT_FLOORS['queue_mean_seconds'] * 1000:.0f} ms, count as agreeing)"
            if floored
            else ""
        ),
        highlight=False,
    )
    cal = answer.get("calibration") or {}
    if cal:
        blocks = cal.get("num_kv_blocks")
        assumed = "given" not in str((cal.get("sources") or {}).get("max_num_batched_tokens", ""))
        console.print(
            f"observed engine as calibrated: {cal.get('replicas')} replica(s) of {cal.get('max_num_seqs')} batch "
            "slots, "
            + (f"{blocks} KV blocks of {cal.get('block_size_tokens')} tokens" if blocks else "KV pool unknown")
            + f", step budget {cal.get('max_num_batched_tokens')} tokens"
            + (" (assumed: vLLM's default)" if assumed else "")
            + f", prefix cache hits {(cal.get('prefix_cache_hit_ratio') or 0.0):.0%} of prompt tokens",
            highlight=False,
            soft_wrap=True,
        )
    by_class = (answer.get("settings") or {}).get("replicas_by_class")
    if by_class:
        console.print(
            "engines by endpoint class: " + ", ".join(f"{c} {n}" for c, n in by_class.items()), highlight=False
        )
    for cls, observed in answer["observed"].items():
        replayed, predicted = answer["replayed"].get(cls, {}), answer["predicted"].get(cls, {})
        table = Table(title=f"{cls or UNCLASSIFIED} ({observed['requests']} requests)")
        for column in ("", "observed", "replayed", "predicted"):
            table.add_column(column, justify="right" if column else "left")
        for key, label in (
            ("ttft_p50_seconds", "TTFT p50"),
            ("ttft_p99_seconds", "TTFT p99"),
            ("queue_mean_seconds", "queue (mean)"),
            ("itl_p50_seconds", "ITL p50"),
        ):
            table.add_row(label, _s(observed.get(key)), _s(replayed.get(key)), _s(predicted.get(key)))
        console.print(table)
    kv = answer.get("kv", {})
    console.print(
        f"KV usage mean: observed {_ratio(kv.get('observed_mean_ratio'))}, replayed "
        f"{_ratio(kv.get('replayed_mean_ratio'))}, predicted {_ratio(kv.get('predicted_mean_ratio'))}; "
        f"preemptions: observed {_count(kv.get('observed_preemptions'))}, "
        f"predicted {_count(kv.get('predicted_preemptions'))}",
        highlight=False,
        soft_wrap=True,
    )
    for warning in answer.get("warnings", []):
        console.print(f"[yellow]warning: {warning}[/]", soft_wrap=True, highlight=False)
    for note in answer.get("notes", []):
        console.print(f"note: {note}", soft_wrap=True, highlight=False)


__all__ = ["OPTIONS", "print_whatif", "refusal_for_cli", "whatif"]
