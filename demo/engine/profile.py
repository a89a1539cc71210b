"""Step times and power of a real model on real GPUs, from SplitwiseSim's measured profile.

Source: ``demo/assets/profiles/splitwise_sim_perf_model.csv`` is ``data/perf_model.csv`` of
SplitwiseSim (https://github.com/Mutinifni/splitwise-sim, MIT), the profile behind the
Splitwise paper (Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
Splitting", ISCA 2024); see ``demo/assets/profiles/ORIGIN.md``. Each row is one measured run:
``model, hardware, prompt_size, batch_size, token_size, peak_power, average_power,
prompt_time (ms), token_time (ms), e2e_time (ms), tensor_parallel``; most configurations were
measured five times, and this module takes the median of the repeats.

What varies in the file, and how it is read here:

- Prefill: ``prompt_time`` is measured over ``prompt_size`` 128..8192 at batch size 1, and for
  ``batch_size`` 1..64 prompts of 512 tokens each. The batched runs cost about what one prompt
  of the same total length costs (TP2 H100: 2 x 512 tokens 155.8 ms vs 1 x 1024 tokens
  158.0 ms; 8 x 512 606 ms vs 1 x 4096 643 ms), i.e. prefill is compute-bound in the number of
  tokens. So :meth:`PerfProfile.prefill_seconds` takes the TOTAL prompt tokens of a prefill
  step and interpolates the batch-size-1 curve over ``prompt_size``.
- Decode: ``token_time`` (time per output token of the whole batch, i.e. one decode step) is
  measured over ``batch_size`` 1..64 at ``prompt_size`` 512 and ``token_size`` 128; it barely
  depends on prompt length (36.9..37.8 ms for 128..8192-token prompts at TP2 H100), so
  :meth:`PerfProfile.decode_step_seconds` interpolates over batch size only.
- Power: ``average_power`` and ``peak_power`` are normalized to the GPU's TDP (peak ~1.0 at
  full load). They were recorded only on ``a100-80gb`` and only up to batch size 16; rows
  without a reading hold 0. For other hardware the A100 ratio of the same model and tensor
  parallelism is used (``power_source_hardware`` says which), and batch sizes beyond the last
  reading keep the last reading.

Interpolation is piecewise linear; below the first measured point the first value is kept
(the fixed cost of a step does not shrink), above the last point the last segment is
extended linearly (prefill cost and decode cost keep growing with work).
"""

from __future__ import annotations

import bisect
import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PROFILE_CSV = Path(__file__).resolve().parents[1] / "assets" / "profiles" / "splitwise_sim_perf_model.csv"

# The prompt length of SplitwiseSim's batch-size sweep, and the output length of its runs.
_SWEEP_PROMPT_SIZE = 512
_SWEEP_TOKEN_SIZE = 128
_POWER_FALLBACK_HARDWARE = "a100-80gb"


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear y(x) over sorted ``xs``: clamp below, extend the last segment above."""
    if x <= xs[0]:
        return ys[0]
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    if i >= len(xs):
        i = len(xs) - 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Curve:
    """A measured curve: sorted x values and the median y of the repeated rows at each x."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def at(self, x: float) -> float:
        """Interpolated y at ``x`` (see the module docstring for the rules at the ends)."""
        return _interpolate(list(self.xs), list(self.ys), x)


def _curve(points: dict[float, list[float]]) -> Curve:
    xs = sorted(points)
    return Curve(tuple(xs), tuple(statistics.median(points[x]) for x in xs))


@dataclass(frozen=True)
class PerfProfile:
    """Measured prefill/decode step times and power ratio of one model on one GPU type.

    Build with :meth:`load`. Times returned are seconds of wall time for one step of the
    engine at the measured tensor parallelism.
    """

    model: str
    hardware: str
    tensor_parallel: int
    prefill_ms_by_prompt_tokens: Curve
    decode_ms_by_batch_size: Curve
    power_ratio_by_batch_size: Curve
    power_source_hardware: str

    @classmethod
    def load(
        cls,
        model: str = "llama2-70b",
        hardware: str = "h100-80gb",
        tensor_parallel: int = 4,
        *,
        path: Path | str = PROFILE_CSV,
    ) -> PerfProfile:
        """Read the SplitwiseSim CSV and build the curves for one configuration.

        ``model``: ``llama2-70b`` or ``bloom-176b``; ``hardware``: ``a100-80gb``,
        ``h100-80gb`` or ``h100-80gb-pcap``; ``tensor_parallel``: 2, 4 or 8 (as profiled).
        Raises ``ValueError`` naming the field when the file has no rows for the choice, and
        ``OSError`` when the file cannot be read.
        """
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        models = {r["model"] for r in rows}
        if model not in models:
            raise ValueError(f"model: no profile rows for {model!r}, expected one of {sorted(models)}")
        mine = [r for r in rows if r["model"] == model]
        hardwares = {r["hardware"] for r in mine}
        if hardware not in hardwares:
            raise ValueError(
                f"hardware: no profile rows for {hardware!r} with {model}, expected one of {sorted(hardwares)}"
            )
        mine = [r for r in mine if r["hardware"] == hardware]
        tps = {int(r["tensor_parallel"]) for r in mine}
        if tensor_parallel not in tps:
            raise ValueError(f"tensor_parallel: no profile rows for {tensor_parallel}, expected one of {sorted(tps)}")
        mine = [r for r in mine if int(r["tensor_parallel"]) == tensor_parallel]

        prefill: dict[float, list[float]] = defaultdict(list)
        decode: dict[float, list[float]] = defaultdict(list)
        for r in mine:
            batch = int(r["batch_size"])
            if batch == 1:
                prefill[float(r["prompt_size"])].append(float(r["prompt_time"]))
            if int(r["prompt_size"]) == _SWEEP_PROMPT_SIZE and int(r["token_size"]) == _SWEEP_TOKEN_SIZE:
                decode[float(batch)].append(float(r["token_time"]))

        power_rows, power_hw = cls._power_rows(rows, model, hardware, tensor_parallel)
        power: dict[float, list[float]] = defaultdict(list)
        for r in power_rows:
            power[float(r["batch_size"])].append(float(r["average_power"]))
        if not power:
            # No reading anywhere for this model and parallelism: a loaded GPU near its TDP.
            power[1.0].append(1.0)
        return cls(model, hardware, tensor_parallel, _curve(prefill), _curve(decode), _curve(power), power_hw)

    @staticmethod
    def _power_rows(rows: list[dict[str, str]], model: str, hardware: str, tp: int) -> tuple[list[dict[str, str]], str]:
        for hw in (hardware, _POWER_FALLBACK_HARDWARE):
            found = [
                r
                for r in rows
                if r["model"] == model
                and r["hardware"] == hw
                and int(r["tensor_parallel"]) == tp
                and int(r["prompt_size"]) == _SWEEP_PROMPT_SIZE
                and int(r["token_size"]) == _SWEEP_TOKEN_SIZE
                and float(r["average_power"]) > 0
            ]
            if found:
                return found, hw
        return [], "none"

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Seconds of one prefill step over ``prompt_tokens`` tokens in total (all prompts of the step).

        Raises ``ValueError`` when ``prompt_tokens`` < 1.
        """
        if prompt_tokens < 1:
            raise ValueError(f"prompt_tokens: must be >= 1, got {prompt_tokens}")
        return self.prefill_ms_by_prompt_tokens.at(prompt_tokens) / 1000.0

    def decode_step_seconds(self, batch_size: int) -> float:
        """Seconds of one decode step producing one token for each of ``batch_size`` sequences.

        Raises ``ValueError`` when ``batch_size`` < 1.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        return self.decode_ms_by_batch_size.at(batch_size) / 1000.0

    def power_ratio(self, batch_size: int) -> float:
        """Average GPU power while busy at ``batch_size``, as a fraction of TDP (0..~1).

        Beyond the last measured batch size the last reading is kept (no extrapolation: power
        saturates at the cap, unlike time).
        """
        curve = self.power_ratio_by_batch_size
        if batch_size >= curve.xs[-1]:
            return curve.ys[-1]
        return curve.at(max(batch_size, 1))
