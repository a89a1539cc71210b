"""The what-if's inputs: their documented forms and bounds, the bound on the work a replay
may take, and how a bad input or a refusal is said (the read API names its parameters, the
CLI its options, in the same sentence)."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import httpx
import pytest
from typer.testing import CliRunner

from inferpath.analysis import whatif as whatif_module
from inferpath.analysis.whatif import (
    MAX_SIMULATED_REQUESTS,
    Change,
    WhatIfInputError,
    check_replay_size,
    parse_change,
    parse_factor_or_count,
    predict,
    rate_scaled,
    rate_scaled_count,
    what_if,
)
from inferpath.analysis.whatif_calibration import TraceRequest, calibrate
from inferpath.cli import app
from inferpath.config import Settings
from inferpath.storage.rows import REQUEST_COLUMNS, RequestRow
from inferpath.storage.store import Store
from inferpath.whatif_cli import OPTIONS, refusal_for_cli

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
WINDOW = {"window_start": T0, "window_end": T0 + timedelta(seconds=120)}


def _rows(n: int = 200, queue_seconds: float = 0.001) -> list[dict]:
    rng = random.Random(3)
    rows, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(2.0)
        out = rng.randint(20, 60)
        rows.append(
            {
                "timestamp": T0 + timedelta(seconds=t),
                "endpoint_class": "interactive",
                "replica": "r1",
                "input_tokens": rng.randint(50, 300),
                "output_tokens": out,
                "ttft_ns": 29_000_000 + int(queue_seconds * 1e9),
                "e2e_ns": 29_000_000 + int(queue_seconds * 1e9) + int(0.01 * (out - 1) * 1e9),
                "itl_ns": 10_000_000,
                "queue_ns": int(queue_seconds * 1e9),
                "prefill_ns": 20_000_000,
                "decode_ns": int(0.01 * (out - 1) * 1e9),
            }
        )
    return rows


def _cli(*args: str, store: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["whatif", "--from", "-30m", "--store", store, *args])
    return result.exit_code, " ".join(result.output.split())


# --------------------------------------------------------------------------- forms and bounds


def test_the_rate_takes_xk_times_k_or_k_up_to_a_factor_of_1000() -> None:
    for text in ("x2", "×2", "2", " X2 ", "x2.0", "x.5e1"):
        assert parse_change(rate=text).rate_factor == (5.0 if "e1" in text else 2.0), text
    assert parse_change(rate="x1000").rate_factor == 1000.0
    with pytest.raises(WhatIfInputError, match=r"^rate: at most x1000, got 'x1e5'$") as raised:
        parse_change(rate="x1e5")
    assert raised.value.param == "rate"
    for text in ("2x", "x", "x1_000", "xinf", "nan", "x-2", "x 2 x"):
        with pytest.raises(WhatIfInputError, match=r"^rate: expected a factor above 0 like x2, got "):
            parse_change(rate=text)
    with pytest.raises(ValueError, match="rate_factor: must be a number > 0 and <= 1000"):
        Change(rate_factor=1e5)


def test_kv_blocks_take_only_a_count_or_an_xk_factor() -> None:
    assert parse_factor_or_count("96", "kv_blocks") == (96, None)
    assert parse_factor_or_count("x2", "kv_blocks") == (None, 2.0)
    assert parse_factor_or_count("×0.5", "kv_blocks") == (None, 0.5)
    for text in ("3x", "96.5", "1_000", "inf", "xnan", "x", "x1e9"):
        with pytest.raises(WhatIfInputError, match=r"^kv_blocks: ") as raised:
            parse_factor_or_count(text, "kv_blocks")
        assert raised.value.param == "kv_blocks" and repr(text) in str(raised.value)


def test_counts_and_classes_are_bounded_and_named_by_their_parameter() -> None:
    for kwargs, said in (
        ({"replicas": 1_000_000}, "replicas: at most 1024, got 1000000"),
        ({"replicas": 0}, "replicas: at least 1, got 0"),
        ({"max_num_seqs": 70_000}, "max_num_seqs: at most 65536, got 70000"),
        ({"batch_window_ms": -1.0}, "batch_window_ms: at least 0 ms, got -1"),
        ({"step_token_budget": 0}, "step_token_budget: at least 1, got 0"),
        ({"step_token_budget": 2.5}, "step_token_budget: expected an integer, got 2.5"),
        (
            {"split_endpoint_classes": "foo"},
            "split_endpoint_classes: expected CLASS=REPLICAS,... like interactive=2,bulk=1 (each count at least 1), "
            "got 'foo'",
        ),
        ({"split_endpoint_classes": "a=1000,b=25"}, "split_endpoint_classes: at most 1024 replicas in all, got 1025"),
        ({"split_endpoint_classes": "a=1,a=2"}, "split_endpoint_classes: each class once"),
        ({"split_endpoint_classes": "a=1", "replicas": 2}, "split_endpoint_classes: give replicas per class, not "),
    ):
        with pytest.raises(WhatIfInputError) as raised:
            parse_change(**kwargs)  # type: ignore[arg-type]
        assert str(raised.value).startswith(said), str(raised.value)
    # A user's braces are text, not a field of the template.
    with pytest.raises(WhatIfInputError) as raised:
        parse_change(split_endpoint_classes="{rate}")
    assert "'{rate}'" in raised.value.text(OPTIONS)


# --------------------------------------------------------------------------- the work bound


def test_rate_scaled_count_is_how_many_requests_rate_scaled_builds() -> None:
    cal = calibrate(_rows(), {}, **WINDOW)
    for factor in (0.5, 1.0, 1.5, 2.0, 3.7, 10.0):
        assert rate_scaled_count(cal.requests, factor, cal.window_seconds) == len(
            rate_scaled(cal.requests, factor, cal.window_seconds)
        )


def test_a_replay_of_more_than_a_million_requests_is_refused_saying_how_many() -> None:
    requests = [
        TraceRequest(
            arrival_seconds=i * 0.5,
            engine_arrival_seconds=i * 0.5,
            prompt_tokens=100,
            output_tokens=10,
            endpoint_class="",
            replica_index=0,
            api_seconds=0.0,
            observed_ttft_seconds=0.03,
            observed_queue_seconds=0.0,
            observed_prefill_seconds=0.02,
            observed_itl_seconds=0.01,
        )
        for i in range(2000)
    ]
    cal = SimpleNamespace(requests=requests, window_seconds=1000.0)
    assert check_replay_size(cal, Change(rate_factor=500.0)) == 1_000_000  # type: ignore[arg-type]
    with pytest.raises(WhatIfInputError) as raised:
        check_replay_size(cal, Change(rate_factor=1000.0))  # type: ignore[arg-type]
    assert raised.value.param == "rate"
    assert str(raised.value) == (
        f"rate: the replay would simulate 2,000,000 requests (2,000 requests of the window at rate x1000), more "
        f"than the {MAX_SIMULATED_REQUESTS:,} a what-if replays (about a minute); narrow the window (start, end) "
        f"or lower rate"
    )
    assert raised.value.text(OPTIONS).endswith("narrow the window (--from, --to) or lower --rate")


def test_the_bound_is_checked_before_anything_is_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    cal = calibrate(_rows(), {}, **WINDOW)
    monkeypatch.setattr(whatif_module, "MAX_SIMULATED_REQUESTS", 1000)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated before the bound was checked")

    monkeypatch.setattr(whatif_module, "simulate", never)
    monkeypatch.setattr(whatif_module, "rate_scaled", never)
    with pytest.raises(WhatIfInputError, match=r"^rate: the replay would simulate 2,000 requests") as raised:
        what_if(cal, Change(rate_factor=10.0))
    assert raised.value.param == "rate"
    monkeypatch.setattr(whatif_module, "MAX_SIMULATED_REQUESTS", 100)  # the window alone is over
    with pytest.raises(WhatIfInputError, match=r"^start: the replay would simulate 200 requests \(200 requests in"):
        what_if(cal, Change(replicas=2))


# --------------------------------------------------------------------------- the read API and the CLI


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path, request):
    """The read API's ``/whatif`` over an in-memory window (an empty store beside it), and the
    CLI asking it."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from inferpath.analysis import whatif_calibration
    from inferpath.server.read_api import router

    monkeypatch.setattr(
        whatif_calibration, "fetch_calibration", lambda store, start, end: calibrate(_rows(), {}, **WINDOW)
    )
    settings = Settings(**getattr(request, "param", {}))
    server = FastAPI()
    server.include_router(router)
    with Store.open(f"chdb://{tmp_path / 'empty-store'}") as store:
        server.state.runtime = SimpleNamespace(store=store, settings=settings)
        client = TestClient(server)

        def ask(method: str, path: str, *args: object, params: dict, **kwargs: object) -> httpx.Response:
            return client.request(method, path, params=params)

        monkeypatch.setattr("inferpath.whatif_cli.ask", ask)
        window = {"start": WINDOW["window_start"].isoformat(), "end": WINDOW["window_end"].isoformat()}
        yield lambda **params: client.get("/api/v1/whatif", params=window | params)


def test_a_stored_window_over_the_bound_is_refused_before_its_rows_are_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from inferpath.analysis import whatif_calibration

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("rows read before the window's size was checked")

    monkeypatch.setattr(whatif_module, "MAX_SIMULATED_REQUESTS", 10)
    monkeypatch.setattr(whatif_calibration, "fetch_calibration", never)
    start = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=5)
    rows = [
        RequestRow(timestamp=start + timedelta(seconds=i), trace_id=f"{i:032x}", status="ok", ttft_ns=1, e2e_ns=2)
        for i in range(30)
    ]
    with Store.open(f"chdb://{tmp_path / 'store'}") as store:
        store.insert("inferpath_requests", [r.to_insert_row() for r in rows], REQUEST_COLUMNS)
        with pytest.raises(WhatIfInputError, match=r"^start: the window holds 30 requests, more than the 10") as raised:
            predict(store, start, start + timedelta(minutes=1), Change(replicas=2))
        assert raised.value.param == "start"
        # A split that leaves out a class of the window is the input's fault, said before calibrating.
        monkeypatch.setattr(whatif_module, "MAX_SIMULATED_REQUESTS", 1000)
        bulk = RequestRow(timestamp=start, trace_id="f" * 32, status="ok", endpoint_class="bulk", ttft_ns=1, e2e_ns=2)
        store.insert("inferpath_requests", [bulk.to_insert_row()], REQUEST_COLUMNS)
        with pytest.raises(WhatIfInputError) as raised:
            predict(store, start, start + timedelta(minutes=1), Change(split_classes=(("nosuch", 2),)))
    assert raised.value.param == "split_endpoint_classes"
    assert str(raised.value) == (
        "split_endpoint_classes: the window's requests are of the classes bulk: give each its replicas "
        "(like bulk=1), got 'nosuch=2'"
    )


def test_the_read_api_names_the_parameter_and_the_cli_its_option_in_the_same_sentence(
    api, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(whatif_module, "MAX_SIMULATED_REQUESTS", 1000)
    response = api(rate="x10")
    assert response.status_code == 422
    (entry,) = response.json()["detail"]
    assert entry["loc"] == ["query", "rate"]
    assert entry["msg"].startswith("rate: the replay would simulate 2,000 requests (200 requests of the window")
    assert entry["msg"].endswith("narrow the window (start, end) or lower rate") and "--" not in entry["msg"]
    code, said = _cli("--rate", "x10", store=f"chdb://{tmp_path / 'unused'}")
    assert code == 2
    assert said == entry["msg"].replace("rate:", "--rate:", 1).replace(
        "(start, end) or lower rate", "(--from, --to) or lower --rate"
    )
    bad = api(rate="x1e5").json()["detail"][0]
    assert bad["loc"] == ["query", "rate"] and bad["msg"] == "rate: at most x1000, got 'x1e5'"
    split = api(split_endpoint_classes="foo").json()["detail"][0]
    assert split["loc"] == ["query", "split_endpoint_classes"]
    assert split["msg"].startswith("split_endpoint_classes: expected CLASS=REPLICAS,")


def test_a_calibration_refusal_names_the_limit_as_each_side_takes_it(
    api, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from inferpath.analysis import whatif_calibration

    # Requests that waited 2 s in an idle engine's queue: no replay reproduces that.
    unreplayable = calibrate(_rows(queue_seconds=2.0), {}, **WINDOW)
    monkeypatch.setattr(whatif_calibration, "fetch_calibration", lambda store, start, end: unreplayable)
    response = api()
    assert response.status_code == 422
    (entry,) = response.json()["detail"]
    assert entry["loc"] == ["query", "start"] and entry["msg"].startswith("no prediction: calibration off by")
    assert "(max_calibration_error)" in entry["msg"] and "--max-calibration-error" not in entry["msg"]
    code, said = _cli(store=f"chdb://{tmp_path / 'unused'}")
    assert code == 2 and said.startswith("no prediction: calibration off by") and said.count("prediction:") == 1
    assert "(--max-calibration-error)" in said and "max_calibration_error" not in said
    assert "not vLLM's default 2048 (max_num_batched_tokens)" in entry["msg"]
    assert "(--max-num-batched-tokens)" in said
    assert refusal_for_cli(response) == entry["msg"].replace(
        "(max_calibration_error)", "(--max-calibration-error)"
    ).replace("(max_num_batched_tokens)", "(--max-num-batched-tokens)")
    # Given the engine's budget, the hint is not repeated.
    assert "token budget" not in api(max_num_batched_tokens=4096).json()["detail"][0]["msg"]


def test_the_cli_says_which_option_was_wrong_before_reading_anything(tmp_path) -> None:
    store = f"chdb://{tmp_path / 'never-opened'}"
    for args, said in (
        (
            ["--split-endpoint-classes", "foo"],
            "--split-endpoint-classes: expected CLASS=REPLICAS,... like interactive=2,bulk=1 (each count at least "
            "1), got 'foo'",
        ),
        (["--replicas", "1000000"], "--replicas: at most 1024, got 1000000"),
        (["--max-num-seqs", "0"], "--max-num-seqs: at least 1, got 0"),
        (
            ["--kv-blocks", "3x"],
            "--kv-blocks: expected a count of at least 1 like 96 or a factor above 0 like x2, got '3x'",
        ),
        (["--rate", "x1e9"], "--rate: at most x1000, got 'x1e9'"),
        (["--batch-window-ms", "-5"], "--batch-window-ms: at least 0 ms, got -5"),
    ):
        code, output = _cli(*args, store=store)
        assert code == 2 and output == said, output
        assert not output.lower().startswith("no prediction")
    assert not (tmp_path / "never-opened").exists()


def test_the_cli_help_states_the_forms_and_bounds() -> None:
    said = " ".join(CliRunner().invoke(app, ["whatif", "--help"]).output.split())
    for text in (
        "an integer, 1 to 1024",
        "an integer, 1 to 65536",
        "a count N (96, at least 1) or a factor xK or ×K",
        "xK, ×K or K",
        "at most 1000",
        "at most 1,000,000 requests",
        "a per-step token budget to predict",
    ):
        assert text in said, text


def test_every_refusal_reads_no_prediction_in_lower_case() -> None:
    assert whatif_module.NO_PREDICTION == "no prediction"
    native = httpx.Response(
        422, json={"detail": [{"loc": ["query", "replicas"], "msg": "Input should be less than or equal to 1024"}]}
    )
    assert refusal_for_cli(native) == "--replicas: Input should be less than or equal to 1024"
    assert refusal_for_cli(httpx.Response(500, text="Internal Server Error")) == "no prediction: Internal Server Error"
    said = refusal_for_cli(httpx.Response(503, text="no prediction: busy"))
    assert said == "no prediction: busy"


def test_the_real_servers_refusal_keeps_its_template_for_the_cli(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # The server bounds what a 422 echoes back; the template of its own sentence (~330
    # characters) must stay whole, or the CLI falls back to the API's names.
    from inferpath.analysis import whatif_calibration
    from inferpath.config import Settings
    from inferpath.server.runtime import serve_in_thread

    unreplayable = calibrate(_rows(queue_seconds=2.0), {}, **WINDOW)
    monkeypatch.setattr(whatif_calibration, "fetch_calibration", lambda store, start, end: unreplayable)
    server = serve_in_thread(Settings(store_url=f"chdb://{tmp_path / 'store'}"), port=0)
    try:
        window = {"start": WINDOW["window_start"].isoformat(), "end": WINDOW["window_end"].isoformat()}
        response = httpx.get(f"{server.url}/api/v1/whatif", params=window | {"replicas": 2}, timeout=60.0)
    finally:
        server.stop()
    assert response.status_code == 422
    said = refusal_for_cli(response)
    assert said.startswith("no prediction: calibration off by") and "(--max-calibration-error)" in said, said


def test_the_engines_token_budget_can_be_given_where_it_is_not_exported(api, tmp_path) -> None:
    """vLLM does not export --max-num-batched-tokens: the calibration takes vLLM's default
    (2048) and says so; the engine's own value, when given, is the one replayed."""
    default = api(replicas=2).json()["calibration"]
    assert default["max_num_batched_tokens"] == 2048
    assert default["sources"]["max_num_batched_tokens"].startswith("vLLM's default (2048): engines do not export it")
    given = api(replicas=2, max_num_batched_tokens=8192).json()["calibration"]
    assert given["max_num_batched_tokens"] == 8192 and given["sources"]["max_num_batched_tokens"] == "given"
    refused = api(max_num_batched_tokens=0)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "max_num_batched_tokens"]
    code, said = _cli("--max-num-batched-tokens", "0", store=f"chdb://{tmp_path / 'unused'}")
    assert code == 2 and "--max-num-batched-tokens" in said
    result = CliRunner().invoke(
        app, ["whatif", "--from", "-30m", "--replicas", "2", "--max-num-batched-tokens", "8192", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout[result.stdout.index("{") :])["calibration"]["max_num_batched_tokens"] == 8192
    # The text answer says which engine it replayed, and what of it was assumed.
    for flags, said_budget in ((["--max-num-batched-tokens", "8192"], "step budget 8192 tokens,"), ([], "(assumed")):
        text = CliRunner().invoke(app, ["whatif", "--from", "-30m", "--replicas", "2", *flags])
        assert text.exit_code == 0, text.output
        line = next(x for x in text.output.splitlines() if x.startswith("observed engine as calibrated:"))
        assert said_budget in line and "prefix cache hits" in line, line


@pytest.mark.parametrize("api", [{"engine_max_num_batched_tokens": 8192}], indirect=True)
def test_the_servers_setting_is_the_token_budget_a_request_does_not_give(api) -> None:
    calibration = api(replicas=2).json()["calibration"]
    assert calibration["max_num_batched_tokens"] == 8192 and calibration["sources"]["max_num_batched_tokens"] == "given"
    assert api(replicas=2, max_num_batched_tokens=4096).json()["calibration"]["max_num_batched_tokens"] == 4096


def test_the_agreement_floor_is_printed_only_where_an_observed_figure_is_under_it() -> None:
    from inferpath.server_access import console
    from inferpath.whatif_cli import print_whatif

    def said(ttft_p50: float, queue_mean: float) -> str:
        observed = {"requests": 40, "ttft_p50_seconds": ttft_p50, "ttft_p99_seconds": 24.0}
        answer = {
            "change_text": "2 replicas",
            "max_calibration_error": 0.04,
            "observed": {"interactive": observed | {"queue_mean_seconds": queue_mean}},
            "replayed": {},
            "predicted": {},
        }
        with console.capture() as captured:
            print_whatif(answer)
        return " ".join(captured.get().split())

    assert "count as agreeing" not in said(24.0, 12.0)
    assert "within 4% of what was observed" in said(24.0, 12.0)
    assert "TTFT figures both under 50 ms" in said(0.03, 12.0)
    assert "count as agreeing" in said(24.0, 0.2)  # a mean queue under 500 ms
