"""Group commit on a real chDB store: concurrent exports share one insert, each is answered
only once committed, retries of grouped exports store nothing twice (also across a crash,
through the commit journal), and one bad export in a group spoils only itself."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from inferpath.server.commit_journal import CommitJournal
from inferpath.server.ingest import JOURNAL_FILE_NAME, CommitResult, DurableIngest, TableRows
from inferpath.storage.rows import SPAN_COLUMNS, SpanRow
from inferpath.storage.store import Store


def _export(number: int, spans: int = 5) -> list[TableRows]:
    start = datetime.now(timezone.utc)
    rows = [SpanRow(timestamp=start, trace_id=f"{number + 1:032x}", span_id=f"{number * 100 + i + 1:016x}",
                    duration_ns=1000).to_insert_row() for i in range(spans)]
    return [TableRows("otel_traces", SPAN_COLUMNS, rows)]


def _count(store: Store) -> tuple[int, int]:
    return store.query("SELECT count(), uniqExact(SpanId) FROM otel_traces")[0]


def _commit_while_store_is_held(ingest: DurableIngest, store: Store, exports: dict[str, list[TableRows]],
                                ) -> dict[str, CommitResult]:
    """Commit every export from its own thread while the store's lock is held, so that all but
    the first queue up behind the first insert; then let them through."""
    results: dict[str, CommitResult] = {}
    threads = [threading.Thread(target=lambda t=token, e=export: results.__setitem__(t, ingest.commit(e, t)))
               for token, export in exports.items()]
    with store._lock:  # the first insert waits here; the other exports queue behind it
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while len(ingest._pending) < len(exports) - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ingest._pending) == len(exports) - 1
    for thread in threads:
        thread.join(30)
    return results


def test_concurrent_exports_share_one_insert_and_each_is_committed(store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        exports = {f"token-{n}": _export(n) for n in range(6)}
        results = _commit_while_store_is_held(ingest, store, exports)
        assert all(result.ok for result in results.values()) and len(results) == 6
        # The first export alone, then the five that queued behind it as one insert.
        assert ingest.insert_seconds_count == 2
        assert ingest.groups_total == 2 and ingest.grouped_exports_total == 6
        assert ingest.commits_total == 6 and ingest.rows_committed_total == 30
        assert _count(store) == (30, 30)
        ingest.close()


def test_a_retried_grouped_export_is_answered_without_a_second_insert(store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        exports = {f"token-{n}": _export(n) for n in range(3)}
        _commit_while_store_is_held(ingest, store, exports)
        inserts = ingest.insert_seconds_count
        # A retry alone would form another block and token than its group's: the journal
        # knows the export is committed.
        assert ingest.commit(exports["token-2"], "token-2").ok
        assert ingest.insert_seconds_count == inserts and ingest.duplicate_exports_total == 1
        assert _count(store) == (15, 15)
        ingest.close()


def test_after_a_crash_during_a_group_insert_committed_members_are_known_and_others_are_not(
        store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        exports = {f"token-{n}": _export(n) for n in range(3)}
        _commit_while_store_is_held(ingest, store, exports)
        ingest.close()
        journal = Path(store.url.path) / JOURNAL_FILE_NAME
        lines = journal.read_text().splitlines()
        # As if the process died after the last group's insert, before its done line, and
        # while a further group (never inserted) was being written.
        assert json.loads(lines[-1]) == {"done": json.loads(lines[-2])["group"]}
        never = _export(7)
        lines = lines[:-1] + [json.dumps({"group": "g-crashed", "members": [
            ["token-7", never[0].rows[0][1], never[0].rows[0][2]]]})]
        journal.write_text("\n".join(lines) + "\n")

        restarted = DurableIngest(store)
        for token in exports:
            assert restarted.journal.is_committed(token)
        assert not restarted.journal.is_committed("token-7")
        assert restarted.commit(exports["token-1"], "token-1").ok
        assert restarted.commit(never, "token-7").ok
        assert restarted.duplicate_exports_total == 1 and restarted.insert_seconds_count == 1
        assert _count(store) == (20, 20)
        restarted.close()


def test_one_bad_export_in_a_group_is_invalid_and_the_others_are_committed(store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        exports = {f"token-{n}": _export(n) for n in range(4)}
        bad_row = list(exports["token-2"][0].rows[0])
        bad_row[0] = datetime(2025, 1, 1)  # naive: the store refuses it
        exports["token-2"] = [TableRows("otel_traces", SPAN_COLUMNS, [tuple(bad_row)])]
        results = _commit_while_store_is_held(ingest, store, exports)
        assert results["token-2"].status == "invalid" and "naive" in results["token-2"].message
        assert all(results[t].ok for t in ("token-0", "token-1", "token-3"))
        assert ingest.store_available and ingest.data_errors_total >= 1
        assert _count(store) == (15, 15)
        assert ingest.journal.is_committed("token-3") and not ingest.journal.is_committed("token-2")
        ingest.close()


def test_exports_are_not_grouped_without_a_journal(store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store, group_commit=False)
        assert ingest.journal is None
        assert ingest.commit(_export(1), "t1").ok and ingest.commit(_export(1), "t1").ok
        assert ingest.groups_total == 0 and _count(store) == (5, 5)  # deduplicated by ClickHouse's token


def test_journal_compacts_to_its_last_groups_and_keeps_their_tokens(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = CommitJournal(path, max_groups=10, keep_groups=3)
    for n in range(25):
        members = [(f"t{n}", f"{n:032x}", f"{n:016x}")]
        journal.done(journal.begin(members), members)
    journal.close()
    lines = path.read_text().splitlines()
    assert len(lines) <= 2 * 10 + 2  # compacted, not 50 lines
    reopened = CommitJournal(path)
    assert reopened.recover(lambda keys: pytest.fail("no uncertain group to look up")) >= 3
    assert reopened.is_committed("t24") and reopened.is_committed("t22")
    assert not reopened.is_committed("t0")
    reopened.close()


def test_journal_lookup_failure_counts_uncertain_members_as_not_committed(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"group":"g1","members":[["t1","' + "a" * 32 + '","' + "b" * 16 + '"]]}\nnot json\n')
    journal = CommitJournal(path)

    def store_down(keys):
        raise ConnectionError("store down")

    assert journal.recover(store_down) == 0 and not journal.is_committed("t1")
    journal.close()


def test_a_retry_queued_with_its_first_attempt_is_stored_once(store_url: str) -> None:
    with Store.open(store_url) as store:
        ingest = DurableIngest(store)
        export = _export(3)
        results: list[CommitResult] = []
        threads = [threading.Thread(target=lambda: results.append(ingest.commit(export, "same")))
                   for _ in range(3)]
        with store._lock:
            threads[0].start()
            deadline = time.monotonic() + 10
            while not ingest._leader_busy and time.monotonic() < deadline:
                time.sleep(0.01)
            for thread in threads[1:]:
                thread.start()
            while len(ingest._pending) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        for thread in threads:
            thread.join(30)
        assert len(results) == 3 and all(result.ok for result in results)
        assert _count(store) == (5, 5) and ingest.duplicate_exports_total == 2
        ingest.close()


def test_an_unwritable_journal_turns_grouping_off_instead_of_failing(store_url: str) -> None:
    with Store.open(store_url) as store:
        (Path(store.url.path) / JOURNAL_FILE_NAME).mkdir()  # a folder where the file should be
        ingest = DurableIngest(store)
        assert ingest.journal is None
        assert ingest.commit(_export(2), "t2").ok and _count(store) == (5, 5)
