"""Telling that another process holds an embedded store, before chDB refuses it in its own words."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from inferpath.storage.store import Store, chdb_folder_in_use


def test_a_store_another_process_has_open_is_in_use(tmp_path: Path, store_held_by_another_process) -> None:
    folder = tmp_path / "store"
    with store_held_by_another_process(folder):
        assert chdb_folder_in_use(folder)
    assert not chdb_folder_in_use(folder)  # closed: its status file is left, unlocked


def test_a_lock_on_the_status_file_is_what_counts(tmp_path: Path) -> None:
    assert not chdb_folder_in_use(tmp_path / "missing")
    assert not chdb_folder_in_use(tmp_path)  # a folder without a status file
    (tmp_path / "status").write_text("")
    assert not chdb_folder_in_use(tmp_path)
    fd = os.open(tmp_path / "status", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert chdb_folder_in_use(tmp_path)
    finally:
        os.close(fd)


def test_the_store_this_process_has_open_is_not_in_use_by_another(store_url: str) -> None:
    with Store.open(store_url) as store:
        assert store.url.path is not None and not chdb_folder_in_use(store.url.path)


def test_the_servers_own_open_error_is_one_sentence_in_the_clis_words(tmp_path: Path) -> None:
    from inferpath.server.runtime import StoreOpenError

    (tmp_path / "status").write_text("")
    fd = os.open(tmp_path / "status", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = str(StoreOpenError(f"chdb://{tmp_path}", RuntimeError("Code: 36. DB::Exception: EmbeddedServer")))
    finally:
        os.close(fd)
    assert held == (
        f"the store at {tmp_path} is in use by another process (an inferpath up or demo?): "
        "stop it, or give this server another --store"
    )
    refused = str(StoreOpenError("https://user:pw@127.0.0.1:1/db", OSError("[Errno 111] Connection refused")))
    assert refused.startswith("cannot open the store https://user:***@127.0.0.1:1/db: cannot reach ClickHouse")
    assert "pw" not in refused and "Error" not in refused
