"""inferpath.analysis: where the latency budget goes and why.

- :mod:`~inferpath.analysis.percentiles`: exact and histogram (PromQL-compatible) quantiles.
- :mod:`~inferpath.analysis.breakdown`: per-request stage shares of TTFT and E2E.
- :mod:`~inferpath.analysis.signals`: engine/GPU signals read back and summarized per window.
- :mod:`~inferpath.analysis.correlate`: latency and signals on one timeline; spike windows.
- :mod:`~inferpath.analysis.diagnosis`: the rules that name the bottleneck.
- :mod:`~inferpath.analysis.verdict`: the verdict's dataclasses and JSON form.

Nothing here imports chDB or a ClickHouse client; functions that read take a ``Store``.
"""

from inferpath.analysis.diagnosis import InsufficientDataError, diagnose, diagnose_from
from inferpath.analysis.verdict import Cause, Evidence, Verdict, verdict_to_dict

__all__ = ["Cause", "Evidence", "InsufficientDataError", "Verdict", "diagnose", "diagnose_from", "verdict_to_dict"]
