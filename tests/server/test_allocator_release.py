"""Free allocator pages handed back on a timer (runtime.AllocatorRelease), on a real chDB
store and server; the glibc arena cap."""

from __future__ import annotations

import time

from inferpath.config import Settings
from inferpath.server.runtime import AllocatorRelease, cap_c_heap_arenas, serve_in_thread
from inferpath.storage.store import Store

MB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_pass_returns_the_pages_a_large_query_freed(store_url: str) -> None:
    with Store.open(store_url) as store:
        # ~300 MB of strings built and freed inside chDB: jemalloc keeps the pages for seconds.
        store.query("SELECT length(groupArray(toString(number))) FROM numbers(5000000)")
        before = rss_bytes()
        AllocatorRelease(store).run_pass()
        assert rss_bytes() < before - 48 * MB


def test_the_server_releases_on_its_interval_and_stops_with_it(store_url: str) -> None:
    with serve_in_thread(Settings(store_url=store_url), port=0) as running:
        release = running.runtime.allocator_release
        assert release.running
        time.sleep(1.5)
        assert release.failures_total == 0
    assert not release.running


def test_the_arena_cap_is_taken_on_linux() -> None:
    assert cap_c_heap_arenas(8)  # glibc's own default for a small machine: changes nothing here
