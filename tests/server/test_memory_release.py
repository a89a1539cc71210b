"""Returning free allocator pages to the OS (server/memory.py), on a real chDB store and server."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from inferpath.config import ENV_MEMORY_RELEASE_INTERVAL_SECONDS, Settings
from inferpath.server.memory import MemoryReleaser, allocator_stats, trim_c_heap
from inferpath.server.runtime import serve_in_thread
from inferpath.storage.store import Store

MB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def metric_values(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_pass_returns_the_pages_a_large_query_freed(store_url: str) -> None:
    with Store.open(store_url) as store:
        # ~300 MB of strings built and freed inside chDB: jemalloc keeps the pages (dirty).
        store.query("SELECT length(groupArray(toString(number))) FROM numbers(5000000)")
        before, rss_before = allocator_stats(store), rss_bytes()
        assert before is not None and before.dirty > 64 * MB, before
        releaser = MemoryReleaser(store, interval_seconds=60.0)
        releaser.release_now()
        after, rss_after = allocator_stats(store), rss_bytes()
        assert after is not None and after.dirty < 16 * MB, after
        # The live data is untouched; the process's resident set fell by what was returned.
        assert after.allocated < before.allocated + 16 * MB
        assert rss_after < rss_before - 48 * MB, (rss_before, rss_after)
        assert releaser.passes_total == 1 and releaser.failures_total == 0 and releaser.seconds_total > 0
        assert releaser._purge_jemalloc is True  # this chDB is built with jemalloc


class _Cycle:
    """An object in a reference cycle with itself, holding rows, watchable by weak reference."""

    def __init__(self, rows: list) -> None:
        self.rows = rows
        self.itself = self


def test_a_pass_frees_rows_left_in_a_reference_cycle(store_url: str) -> None:
    # Cyclic garbage waits for the cycle collector, which the server's thresholds leave idle
    # for minutes (Store.insert leaves none, tests/storage; this is the net for any other).
    gc.disable()  # as idle as the server's collector: nothing but the pass may collect
    try:
        with Store.open(store_url) as store:
            garbage = [_Cycle([(f"{n:032x}", n) for n in range(5000)]) for _ in range(3)]
            watched = [weakref.ref(cycle) for cycle in garbage]
            del garbage
            assert all(ref() is not None for ref in watched)  # garbage, still holding its rows
            MemoryReleaser(store, interval_seconds=60.0).release_now()
            assert all(ref() is None for ref in watched)
    finally:
        gc.enable()


def test_a_pass_collects_the_young_generation_at_most_once_per_interval(store_url: str) -> None:
    from inferpath.server import memory

    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    with Store.open(store_url) as store:
        releaser = MemoryReleaser(store, interval_seconds=60.0)
        gc.callbacks.append(count)
        try:
            gc.disable()  # only the releaser collects meanwhile
            releaser.release_now()
            first = list(collections)
            releaser.release_now()
            releaser.release_now()
            second = collections[len(first) :]
            releaser._collected_at -= memory.COLLECT_INTERVAL_SECONDS  # the interval has passed
            releaser.release_now()
            third = collections[len(first) + len(second) :]
        finally:
            gc.enable()
            gc.callbacks.remove(count)
    assert first == [0] and second == [] and third == [0]


def test_glibc_trim_is_available_on_linux() -> None:
    assert trim_c_heap() is True


def test_the_server_releases_on_its_interval_and_counts_it(store_url: str) -> None:
    settings = Settings(store_url=store_url, memory_release_interval_seconds=0.1)
    with serve_in_thread(settings, port=0) as running:
        assert running.runtime.memory_releaser is not None
        deadline = time.monotonic() + 20.0
        values = metric_values(running.url)
        while (
            values["inferpath_server_memory_release_passes_total"] < 3
            or "inferpath_embedded_store_resident_bytes" not in values
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
            values = metric_values(running.url)
        assert values["inferpath_server_memory_release_passes_total"] >= 3
        assert values["inferpath_server_memory_release_errors_total"] == 0
        assert values["inferpath_server_memory_release_seconds_total"] > 0
        # The embedded store's allocator, as jemalloc counts it.
        assert (
            0 < values["inferpath_embedded_store_allocated_bytes"] < values["inferpath_embedded_store_resident_bytes"]
        )
        assert 0 <= values["inferpath_embedded_store_dirty_bytes"] < values["inferpath_embedded_store_resident_bytes"]
        thread_names = {t.name for t in threading.enumerate()}
        assert "inferpath-memory-release" in thread_names
        # A scrape never waits on the store: it answers while the store is held (a slow insert).
        with running.runtime.store._lock:
            held = httpx.get(f"{running.url}/metrics", timeout=5.0)
        assert held.status_code == 200 and "inferpath_embedded_store_resident_bytes" in held.text


def test_interval_zero_turns_the_releaser_off(store_url: str) -> None:
    with serve_in_thread(Settings(store_url=store_url, memory_release_interval_seconds=0), port=0) as running:
        assert running.runtime.memory_releaser is None
        values = metric_values(running.url)
        assert values["inferpath_server_memory_release_passes_total"] == 0


def test_the_interval_is_a_setting_and_validated() -> None:
    assert Settings.from_env({ENV_MEMORY_RELEASE_INTERVAL_SECONDS: "2.5"}).memory_release_interval_seconds == 2.5
    assert Settings().memory_release_interval_seconds == 1.0
    for bad in ("-1", "nan", "inf", "soon", "0.05", "0.0000001"):  # 0 < interval < 0.1 only burns CPU
        with pytest.raises(ValidationError, match="memory_release_interval_seconds"):
            Settings.from_env({ENV_MEMORY_RELEASE_INTERVAL_SECONDS: bad})
    with pytest.raises(ValueError, match="interval_seconds must be > 0"):
        MemoryReleaser(object(), interval_seconds=0)


def test_failing_passes_are_counted_logged_once_and_never_raise(store_url: str, caplog) -> None:
    store = Store.open(store_url)
    store.close()  # every pass now fails: the store is closed
    releaser = MemoryReleaser(store, interval_seconds=0.02)
    with caplog.at_level(logging.WARNING, logger="inferpath.server.memory"):
        releaser.start()
        deadline = time.monotonic() + 10.0
        while releaser.failures_total < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        releaser.stop()
    assert releaser.failures_total >= 3 and releaser.passes_total == 0
    warnings = [r for r in caplog.records if "could not return free memory" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert not releaser.running


# Counts the glibc malloc arenas of a fresh process after six threads allocated at once:
# glibc's malloc_info writes one <heap nr="…"> element per arena.
_ARENAS_SCRIPT = """
import ctypes, sys, tempfile, threading
from inferpath.server.memory import limit_c_heap_arenas
if sys.argv[1] != "default":
    assert limit_c_heap_arenas(int(sys.argv[1]))
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
started = threading.Barrier(7)
held = []
def allocate():
    held.append([bytes(4096) for _ in range(64)])  # over pymalloc's 512 bytes: glibc malloc
    started.wait()
    started.wait()
threads = [threading.Thread(target=allocate) for _ in range(6)]
for thread in threads:
    thread.start()
started.wait()
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    stream = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(out.name).read().count("<heap nr="))
started.wait()
for thread in threads:
    thread.join()
"""


@pytest.mark.parametrize("arenas", [1, 2])
def test_limit_c_heap_arenas_caps_the_arenas_new_threads_get(arenas: int) -> None:
    import subprocess
    import sys

    def count(setting: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _ARENAS_SCRIPT, setting], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert count(str(arenas)) == arenas
    assert count("default") > arenas  # without the cap, the six threads got arenas of their own


def test_limit_c_heap_arenas_refuses_zero() -> None:
    from inferpath.server.memory import limit_c_heap_arenas

    with pytest.raises(ValueError, match="at least 1"):
        limit_c_heap_arenas(0)
