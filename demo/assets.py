"""Paths of the files shipped with the demo (installed with the package, never downloaded)."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
# Stored gzipped: the file is large, and it is read once per process.
TOKENIZER_JSON_GZ = ASSETS_DIR / "tokenizer" / "tokenizer.json.gz"
AZURE_CODE_TRACE_CSV = ASSETS_DIR / "traces" / "azure2023_AzureLLMInferenceTrace_code.csv"
PERF_PROFILE_CSV = ASSETS_DIR / "profiles" / "splitwise_sim_perf_model.csv"
CORPUS_JSONL = ASSETS_DIR / "corpus" / "docs.jsonl"


def tokenizer_json_text() -> str:
    """The shipped ``tokenizer.json`` (Hugging Face tokenizers format) as text."""
    import gzip

    return gzip.decompress(TOKENIZER_JSON_GZ.read_bytes()).decode("utf-8")


def load_tokenizer():  # -> tokenizers.Tokenizer (tokenizers is an extra of the demo)
    """The shipped pretrained WordPiece tokenizer (``tokenizers.Tokenizer``), read from disk only.

    The file was saved for a 128-token sentence-embedding model, with fixed padding and
    truncation to 128 tokens; both are switched off here so a prompt keeps its real length.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json_text())
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer
