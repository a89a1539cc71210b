"""A small on-disk journal of grouped commits, so that grouping exports stays exactly-once.

The receiver commits several concurrent exports as ONE insert (see :mod:`inferpath.server.ingest`).
ClickHouse's ``insert_deduplication_token`` then belongs to the group, not to an export, so a
client's retry of one export (whose 200 was lost) would land in a different group and be stored
twice. The journal closes that gap:

- before a group is inserted, one ``intent`` line lists each member's export token and one
  sample key of its rows (``TraceId``, ``SpanId``);
- after the insert returned, one ``done`` line names the group.

At start-up :meth:`CommitJournal.recover` reads it back: tokens of ``done`` groups are known
committed; members of a trailing group without ``done`` (the process died during its insert)
are looked up by their sample key in the store, and those found count as committed. A retry
whose token is known committed is answered 200 without a second insert.

Lines are written with ``write`` + ``flush`` (no ``fsync``): the journal survives a killed
process, as ClickHouse's own parts do (it does not ``fsync`` inserts by default either). The
file is rewritten to its last ``keep_groups`` groups when it passes ``max_groups``: a retry
comes within seconds, and only exports that were in flight at a crash are ever retried.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterable, Sequence

__all__ = ["CommitJournal", "JournalMember"]

logger = logging.getLogger(__name__)

# (export token, sample TraceId, sample SpanId); the sample may be ("", "") when the export
# has no rows with ids.
JournalMember = tuple[str, str, str]


class CommitJournal:
    """Append-only journal of grouped commits at ``path`` (a file; its folder must exist).

    ``max_groups`` (≥ 2): groups kept before the file is compacted to the last
    ``keep_groups`` (1 ≤ keep_groups < max_groups). ``max_tokens``: committed tokens held
    in memory (oldest forgotten first). Raises ``ValueError`` for bad limits and ``OSError``
    when the file cannot be opened.
    """

    def __init__(self, path: Path, *, max_groups: int = 2000, keep_groups: int = 200,
                 max_tokens: int = 100_000) -> None:
        if not 1 <= keep_groups < max_groups:
            raise ValueError(f"need 1 <= keep_groups < max_groups, got {keep_groups} and {max_groups}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.path = Path(path)
        self.max_groups = max_groups
        self.keep_groups = keep_groups
        self.max_tokens = max_tokens
        self._committed: OrderedDict[str, None] = OrderedDict()
        self._groups: list[tuple[str, list[JournalMember]]] = []  # done groups still in the file
        self._next_group = 0
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open

    # ------------------------------------------------------------------ recovery
    def recover(self, present_keys: Callable[[Sequence[tuple[str, str]]], set[tuple[str, str]]]) -> int:
        """Load the committed tokens from the file; return how many are known committed.

        ``present_keys(keys)`` returns which ``(trace_id, span_id)`` keys the store holds; it
        is called once, only when the last group has no ``done`` line. If it raises, those
        members count as not committed (their retries are inserted again). Unreadable lines
        are skipped with a warning.
        """
        intents: dict[str, list[JournalMember]] = {}
        order: list[str] = []
        done: set[str] = set()
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            logger.warning("commit journal %s unreadable, starting empty: %s", self.path, exc)
            return 0
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
                if "done" in record:
                    done.add(str(record["done"]))
                else:
                    group = str(record["group"])
                    intents[group] = [(str(t), str(a), str(b)) for t, a, b in record["members"]]
                    order.append(group)
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("commit journal %s line %d skipped: %s", self.path, number, exc)
        uncertain = [m for g in order if g not in done for m in intents[g]]
        found: set[tuple[str, str]] = set()
        keys = [(trace_id, span_id) for _, trace_id, span_id in uncertain if span_id]
        if keys:
            try:
                found = set(present_keys(keys))
            except Exception as exc:  # noqa: BLE001 - unknown: the retry inserts again
                logger.warning("commit journal: could not look up %d uncertain exports: %s", len(keys), exc)
        for group in order:
            if group in done:
                self._groups.append((group, intents[group]))
                self._remember(token for token, _, _ in intents[group])
        recovered = [m for m in uncertain if (m[1], m[2]) in found]
        if recovered:
            self._groups.append((f"r{os.getpid()}-{len(order)}", recovered))
            self._remember(token for token, _, _ in recovered)
        self._next_group = len(order)
        self._compact()
        return len(self._committed)

    # ------------------------------------------------------------------ use
    def is_committed(self, token: str) -> bool:
        """True when an export with ``token`` is known committed."""
        return token in self._committed

    def begin(self, members: Sequence[JournalMember]) -> str:
        """Write the ``intent`` line of a group; return its id. Raises ``OSError``."""
        group = f"g{os.getpid()}-{self._next_group}"
        self._next_group += 1
        self._write({"group": group, "members": [list(m) for m in members]})
        return group

    def done(self, group: str, members: Sequence[JournalMember]) -> None:
        """Write the ``done`` line of ``group`` and remember its tokens. Never raises: the
        rows are committed whatever happens to the journal (a lost line only weakens dedup
        of a retry after a crash, which readers still dedup by span id)."""
        try:
            self._write({"done": group})
        except OSError as exc:
            logger.warning("commit journal %s: could not write done line: %s", self.path, exc)
        self._groups.append((group, list(members)))
        self._remember(token for token, _, _ in members)
        if len(self._groups) > self.max_groups:
            self._compact()

    def close(self) -> None:
        """Close the file; idempotent."""
        if not self._file.closed:
            self._file.close()

    # ------------------------------------------------------------------ internals
    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def _remember(self, tokens: Iterable[str]) -> None:
        for token in tokens:
            if token:
                self._committed[token] = None
                self._committed.move_to_end(token)
        while len(self._committed) > self.max_tokens:
            self._committed.popitem(last=False)

    def _compact(self) -> None:
        """Rewrite the file with the last ``keep_groups`` done groups (atomic rename)."""
        self._groups = self._groups[-self.keep_groups:]
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(temporary, "w", encoding="utf-8") as out:
                for group, members in self._groups:
                    out.write(json.dumps({"group": group, "members": [list(m) for m in members]},
                                         separators=(",", ":")) + "\n")
                    out.write(json.dumps({"done": group}, separators=(",", ":")) + "\n")
            self._file.close()
            os.replace(temporary, self.path)
        except OSError as exc:
            logger.warning("commit journal %s: compaction failed: %s", self.path, exc)
        finally:
            if self._file.closed:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
