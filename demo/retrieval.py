"""Retrieval over the demo corpus with BM25 (the ``bm25s`` library)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inferpath.demo.assets import CORPUS_JSONL


@dataclass(frozen=True, slots=True)
class Passage:
    doc_id: str
    title: str
    text: str


class BM25Retriever:
    """Top-k BM25 retrieval over a JSONL corpus of ``{"id", "title", "text"}`` objects.

    The index is built once at construction (CPU, milliseconds for the shipped corpus).
    Raises ``ValueError`` naming the line of a malformed corpus entry.
    """

    def __init__(self, corpus_path: Path | str | None = None) -> None:
        import bm25s  # the demo extra; imported here so `import inferpath` never needs it

        path = Path(corpus_path) if corpus_path is not None else CORPUS_JSONL
        passages: list[Passage] = []
        for line_no, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                passages.append(Passage(str(item["id"]), str(item["title"]), str(item["text"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path.name} line {line_no}: expected an object with id, title, text") from exc
        if not passages:
            raise ValueError(f"{path.name}: corpus is empty")
        self.passages = passages
        self._retriever = bm25s.BM25()
        self._retriever.index(
            bm25s.tokenize([f"{p.title}. {p.text}" for p in passages], show_progress=False), show_progress=False
        )

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The ``k`` best passages for ``query`` (fewer if the corpus is smaller)."""
        import bm25s

        k = max(1, min(k, len(self.passages)))
        tokens = bm25s.tokenize([query], show_progress=False)
        if not tokens.vocab:  # a query of stop words only has nothing to rank by
            return self.passages[:k]
        indices, _scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        return [self.passages[int(i)] for i in indices[0]]
