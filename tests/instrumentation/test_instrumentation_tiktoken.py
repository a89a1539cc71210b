"""Case 6: token counting with tiktoken in a service without network.

Each variant runs in a fresh Python process (a service's whole life: tiktoken's registry,
the once-per-process warning, the socket guard) that serves a real FastAPI gateway on
uvicorn, 127.0.0.1. Every connect() to anything but loopback is refused and recorded.

The "filled cache" variant cannot use cl100k_base (its file is not in any package and
cannot be downloaded here), so it registers a small encoding through tiktoken's own plugin
mechanism (``tiktoken_ext``) whose BPE file is loaded by ``load_tiktoken_bpe`` with an
``expected_hash``, exactly the cache path cl100k_base takes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("tiktoken")

BLOB_URL = "https://openaipublic.example/encodings/inferpath_test.tiktoken"

SERVICE = textwrap.dedent("""
    import json, socket, statistics, sys, threading, time
    blocked = []
    _connect = socket.socket.connect
    def guarded_connect(self, address):
        host = address[0] if isinstance(address, tuple) else str(address)
        if host not in ("127.0.0.1", "::1", "localhost"):
            blocked.append(str(address))
            raise OSError("no network in this test")
        return _connect(self, address)
    socket.socket.connect = guarded_connect
    socket.socket.connect_ex = lambda self, address: guarded_connect(self, address) or 0

    import httpx, uvicorn
    from fastapi import FastAPI
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import inferpath
    from inferpath.instrumentation import provider
    from inferpath.instrumentation.tiktoken_tokens import count_tokens
    import tiktoken.load

    cache_reads = []
    _read_file_cached = tiktoken.load.read_file_cached
    def counted(*args, **kwargs):
        cache_reads.append(args[0])
        return _read_file_cached(*args, **kwargs)
    tiktoken.load.read_file_cached = counted

    exporter = InMemorySpanExporter()
    app = FastAPI()
    inferpath.instrument(app, service_name="gw", span_exporter=exporter,
                         integrations=("tiktoken",))
    ENCODING = sys.argv[1]

    @app.post("/count")
    async def count(body: dict) -> dict:
        result = count_tokens(body["prompt"], ENCODING)
        return {"tokens": result.tokens, "estimated": result.estimated}

    @app.post("/plain")
    async def plain(body: dict) -> dict:
        return {"tokens": None}

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    url = "http://127.0.0.1:%d" % server.servers[0].sockets[0].getsockname()[1]
    prompt = {"prompt": "The quick brown fox jumps over the lazy dog, twice over."}
    with httpx.Client() as client:
        baseline = []
        for _ in range(10):
            started = time.perf_counter(); client.post(url + "/plain", json=prompt)
            baseline.append(time.perf_counter() - started)
        started = time.perf_counter()
        first = client.post(url + "/count", json=prompt)
        first_seconds = time.perf_counter() - started
        answers = [client.post(url + "/count", json=prompt).json() for _ in range(20)]
    server.should_exit = True
    provider.force_flush()
    spans = [s for s in exporter.get_finished_spans() if s.name == "tokenize"]
    print(json.dumps({
        "status": first.status_code, "first": first.json(), "answers": answers,
        "added_seconds": first_seconds - statistics.median(baseline),
        "cache_reads": len(cache_reads), "blocked": blocked,
        "estimated_attr": [s.attributes.get("inferpath.tokenize.estimated") for s in spans],
        "tokens_attr": [s.attributes.get("gen_ai.usage.input_tokens") for s in spans],
    }))
""")


def run_service(tmp_path: Path, encoding: str, extra_path: Path | None = None) -> tuple[dict, str]:
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "cache")}
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    done = subprocess.run([sys.executable, str(script), encoding], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_empty_cache_without_network_is_served_with_a_marked_estimate(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    report, stderr = run_service(tmp_path, "cl100k_base")
    assert report["status"] == 200
    expected = -(-len("The quick brown fox jumps over the lazy dog, twice over.") // 4)
    assert report["first"] == {"tokens": expected, "estimated": True}
    assert all(answer == report["first"] for answer in report["answers"])
    # No network wait (a download attempt waits seconds); the bound leaves room for a busy
    # neighbour, the cost itself is measured in bench/.
    assert report["added_seconds"] <= 0.5
    assert report["cache_reads"] == 1  # tried once per process, never per request
    assert report["blocked"] == []  # not even a connect attempt
    assert stderr.count("is not in the local cache") == 1  # warned once
    assert report["estimated_attr"] == [True] * 21
    assert report["tokens_attr"] == [expected] * 21


def test_filled_cache_counts_exactly_and_opens_no_socket(tmp_path: Path) -> None:
    ranks = b"".join(base64.b64encode(bytes([i])) + b" " + str(i).encode() + b"\n" for i in range(256))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / hashlib.sha1(BLOB_URL.encode()).hexdigest()).write_bytes(ranks)
    plugin = tmp_path / "plugins" / "tiktoken_ext"
    plugin.mkdir(parents=True)
    (plugin / "inferpath_test_encoding.py").write_text(
        textwrap.dedent(f'''
        from tiktoken.load import load_tiktoken_bpe

        def inferpath_test():
            return {{
                "name": "inferpath_test",
                "pat_str": r"\\S+|\\s+",
                "mergeable_ranks": load_tiktoken_bpe(
                    "{BLOB_URL}", expected_hash="{hashlib.sha256(ranks).hexdigest()}"),
                "special_tokens": {{}},
            }}

        ENCODING_CONSTRUCTORS = {{"inferpath_test": inferpath_test}}
    ''')
    )
    report, stderr = run_service(tmp_path, "inferpath_test", tmp_path / "plugins")
    prompt = "The quick brown fox jumps over the lazy dog, twice over."
    # Byte-level ranks without merges: one token per UTF-8 byte, an exact count.
    assert report["first"] == {"tokens": len(prompt.encode()), "estimated": False}
    assert report["blocked"] == []
    assert report["cache_reads"] == 1
    assert "local cache" not in stderr
    assert report["estimated_attr"] == [False] * 21
