"""Paths of the files shipped with the demo (installed with the package, never downloaded)."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
TOKENIZER_JSON = ASSETS_DIR / "tokenizer" / "tokenizer.json"
AZURE_CODE_TRACE_CSV = ASSETS_DIR / "traces" / "azure2023_AzureLLMInferenceTrace_code.csv"
PERF_PROFILE_CSV = ASSETS_DIR / "profiles" / "splitwise_sim_perf_model.csv"
CORPUS_JSONL = ASSETS_DIR / "corpus" / "docs.jsonl"
