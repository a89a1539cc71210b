"""Telling that another process holds an embedded store, before chDB refuses it in its own words."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from inferpath.storage.store import Store, chdb_folder_in_use


def test_a_store_another_process_has_open_is_in_use(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from inferpath.storage.store import Store; "
            f"store = Store.open({'chdb://' + str(folder)!r}); print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        assert chdb_folder_in_use(folder)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
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
