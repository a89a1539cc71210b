"""The scheduler on its own: token counts, queueing, KV pressure and preemption, step timing."""

from __future__ import annotations

import asyncio

import pytest

from inferpath.demo.engine import Engine, EngineConfig, RequestAborted, TokenEvent


async def _drain(stream) -> list[TokenEvent]:
    return [event async for event in stream]


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_each_request_yields_exactly_max_tokens_with_consistent_intervals():
    async def main():
        engine = Engine(EngineConfig(time_scale=0.05))
        engine.start()
        try:
            return await asyncio.gather(*(_drain(engine.submit(300, n)) for n in (1, 7, 40)))
        finally:
            await engine.stop()

    for events, max_tokens in zip(_run(main()), (1, 7, 40)):
        assert [e.index for e in events] == list(range(max_tokens))
        assert [e.finished for e in events] == [False] * (max_tokens - 1) + [True]
        assert all(e.metrics is None for e in events[:-1])
        m = events[-1].metrics
        assert m.completion_tokens == max_tokens and m.prompt_tokens == 300
        assert m.ttft_seconds == pytest.approx(m.queue_seconds + m.prefill_seconds)
        assert m.e2e_seconds == pytest.approx(m.ttft_seconds + m.decode_seconds)
        assert m.inference_seconds == pytest.approx(m.prefill_seconds + m.decode_seconds)
        assert m.prefill_seconds > 0
        assert (m.decode_seconds > 0) == (max_tokens > 1)
        assert m.finished_wall_ns > m.arrival_wall_ns


def test_step_times_come_from_the_profile():
    async def main():
        engine = Engine(EngineConfig())  # time_scale 1: the measured speed
        engine.start()
        try:
            events = await _drain(engine.submit(512, 6))
        finally:
            await engine.stop()
        return engine, events[-1].metrics

    engine, m = _run(main())
    assert m.queue_seconds < 0.005
    assert m.prefill_seconds == pytest.approx(engine.profile.prefill_seconds(512), abs=0.01)
    # A sleep never ends early but may end late beside a busy neighbour (+48 ms on 149 ms once).
    decode = 5 * engine.profile.decode_step_seconds(1)
    assert 0.85 * decode <= m.decode_seconds <= decode + 0.1


def test_time_scale_and_slowdown_multiply_step_times():
    async def one(config):
        engine = Engine(config)
        engine.start()
        try:
            return (await _drain(engine.submit(2048, 2)))[-1].metrics
        finally:
            await engine.stop()

    fast = _run(one(EngineConfig(time_scale=0.5)))
    slow = _run(one(EngineConfig(time_scale=0.5, prefill_slowdown=3.0)))
    base = Engine(EngineConfig()).profile.prefill_seconds(2048)
    # A sleep never ends early but may end late beside a busy neighbour (CI: 18 ms on 0.3 s).
    assert 0.5 * base - 0.005 <= fast.prefill_seconds <= 0.5 * base + 0.05
    assert 1.5 * base - 0.005 <= slow.prefill_seconds <= 1.5 * base + 0.05


def test_queueing_appears_when_arrivals_exceed_capacity():
    async def main():
        engine = Engine(EngineConfig(time_scale=0.05, max_num_seqs=2))
        engine.start()
        try:
            tasks = [asyncio.create_task(_drain(engine.submit(200, 100))) for _ in range(6)]
            await asyncio.sleep(0.02)
            during = engine.stats()
            results = await asyncio.gather(*tasks)
            return during, engine.stats(), [r[-1].metrics for r in results]
        finally:
            await engine.stop()

    during, after, metrics = _run(main())
    assert during.num_requests_running == 2 and during.num_requests_waiting == 4
    assert after.num_requests_running == 0 and after.num_requests_waiting == 0
    queue = [m.queue_seconds for m in metrics]
    assert queue[0] < 0.005 and queue[1] < 0.005
    # Each later pair waited for the pair before it to finish its 100 tokens.
    assert queue[2] > 0.5 * metrics[0].e2e_seconds
    assert queue[4] > queue[2]
    assert after.num_requests_finished_total == 6


def test_kv_pressure_preempts_the_youngest_and_everything_still_finishes():
    async def main():
        # 40 blocks x 16 tokens: three 150-token prompts are admitted (10 blocks each, a
        # fourth would eat the watermark); each grows to 17 blocks while decoding 120 tokens,
        # so the pool runs dry and the youngest is preempted by recompute.
        engine = Engine(EngineConfig(time_scale=0.02, num_kv_blocks=40, max_num_seqs=8))
        engine.start()
        usage: list[float] = []
        try:
            tasks = [asyncio.create_task(_drain(engine.submit(150, 120))) for _ in range(5)]
            while not all(t.done() for t in tasks):
                usage.append(engine.stats().kv_cache_usage_perc)
                await asyncio.sleep(0.002)
            return engine.stats(), usage, [t.result() for t in tasks]
        finally:
            await engine.stop()

    stats, usage, results = _run(main())
    assert stats.num_preemptions_total >= 1
    assert sum(r[-1].metrics.num_preemptions for r in results) == stats.num_preemptions_total
    assert all(len(r) == 120 and [e.index for e in r] == list(range(120)) for r in results)
    assert all(0.0 <= u <= 1.0 for u in usage) and max(usage) > 0.9
    assert stats.kv_cache_usage_perc == 0.0
    # Recompute re-prefills the prompt and the tokens already emitted.
    assert stats.prompt_tokens_total > 5 * 150


def test_no_preemption_when_blocks_are_plentiful():
    async def main():
        engine = Engine(EngineConfig(time_scale=0.02, num_kv_blocks=4096))
        engine.start()
        try:
            await asyncio.gather(*(_drain(engine.submit(150, 60)) for _ in range(5)))
            return engine.stats()
        finally:
            await engine.stop()

    stats = _run(main())
    assert stats.num_preemptions_total == 0
    assert stats.generation_tokens_total == 5 * 60


def test_gpu_stats_follow_the_work():
    async def main():
        engine = Engine(EngineConfig(time_scale=0.2))
        idle = engine.stats()
        engine.start()
        try:
            task = asyncio.create_task(_drain(engine.submit(1000, 100)))
            await asyncio.sleep(0.15)
            busy = engine.stats()
            await task
        finally:
            await engine.stop()
        return engine, idle, busy

    engine, idle, busy = _run(main())
    assert idle.gpu_utilization_ratio == 0.0
    assert idle.gpu_power_watts == pytest.approx(engine.gpu.idle_watts)
    assert busy.gpu_utilization_ratio > 0.1
    assert busy.gpu_power_watts > idle.gpu_power_watts
    # Llama-2-70B fp16 weights over 4 GPUs, plus the KV blocks in use.
    weights_per_gpu = 68_976_648_192 * 2 // 4
    assert idle.gpu_memory_used_bytes == weights_per_gpu
    assert busy.gpu_memory_used_bytes > weights_per_gpu
    assert busy.gpu_memory_total_bytes == 81_559 * 1024 * 1024


def test_closing_a_stream_aborts_the_request_and_frees_its_blocks():
    async def main():
        engine = Engine(EngineConfig(time_scale=0.05))
        engine.start()
        try:
            stream = engine.submit(400, 500)
            first = await stream.__anext__()
            held = engine.stats().kv_cache_usage_perc
            await stream.aclose()
            return first, held, engine.stats()
        finally:
            await engine.stop()

    first, held, after = _run(main())
    assert first.index == 0 and held > 0
    assert after.kv_cache_usage_perc == 0.0 and after.num_requests_running == 0


def test_stopping_the_engine_aborts_open_streams():
    async def main():
        engine = Engine(EngineConfig(time_scale=0.05))
        engine.start()
        stream = engine.submit(100, 1000)
        await stream.__anext__()
        await engine.stop()
        with pytest.raises(RequestAborted):
            await stream.__anext__()

    _run(main())


@pytest.mark.parametrize(
    "prompt_tokens, max_tokens, field",
    [
        (0, 5, "prompt_tokens"),
        (5, 0, "max_tokens"),
        (5, 1.5, "max_tokens"),
        (60_000, 10_000, "KV blocks"),
    ],
)
def test_invalid_requests_are_rejected_naming_the_field(prompt_tokens, max_tokens, field):
    engine = Engine(EngineConfig())
    with pytest.raises(ValueError, match=field):
        engine.submit(prompt_tokens, max_tokens)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_kv_blocks": 0}, "num_kv_blocks"),
        ({"time_scale": 0}, "time_scale"),
        ({"decode_slowdown": float("nan")}, "decode_slowdown"),
        ({"num_kv_blocks": 10_000_000}, "num_kv_blocks"),
        ({"model": "gpt-5"}, "model"),
    ],
)
def test_invalid_configs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_a_batch_window_that_closes_between_clock_readings_does_not_stall_the_queue():
    """The loop plans a step and sizes the window's hold on one clock reading. A clock that
    moves past the window between two readings (a preempted process, a loaded machine) once
    left the head held with no timer set: the request waited for the next arrival forever."""
    ticks = iter(range(10**6))

    def stepping_clock() -> float:
        return next(ticks) * 0.3  # every reading 0.3 s later than the one before

    async def main():
        engine = Engine(EngineConfig(time_scale=0.01, batch_window_seconds=0.5), clock=stepping_clock)
        engine.start()
        try:
            return await asyncio.wait_for(_drain(engine.submit(64, 3)), timeout=5)
        finally:
            await engine.stop()

    events = _run(main())
    assert [e.index for e in events] == [0, 1, 2] and events[-1].finished
