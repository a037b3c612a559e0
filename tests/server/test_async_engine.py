"""AsyncEngine over a FakeEngine: ordering, queueing past the running limit, aborts on every way a
consumer can stop, shutdown, step failures, and the one-thread rule (FakeEngine asserts it)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.server.fake_engine import FakeEngine, scripted_text
from wisp.engine.async_engine import AsyncEngine, EngineShutDown
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError


def run(coro_fn, **fake_kw):
    """Run coro_fn(async_engine, fake) on a fresh loop with a started engine; always shut it down."""
    fake = FakeEngine(**fake_kw)
    engine = AsyncEngine(fake)
    engine.start()
    try:
        return asyncio.run(asyncio.wait_for(coro_fn(engine, fake), 30))
    finally:
        engine.shutdown()


async def settled(engine: AsyncEngine, timeout: float = 5.0) -> dict:
    """The stats once nothing is running or waiting and no block is used (polls fresh snapshots: the last
    one can be from before the latest work, since the engine thread snapshots on demand, not per step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = await engine.refresh_stats()
        if s["num_running"] == s["num_waiting"] == s["kv_blocks_used"] == 0:
            return s
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine did not settle: {engine.stats()}")


async def handled(engine: AsyncEngine) -> None:
    """Return once the engine thread has handled every command posted so far: a one-token request posted
    now finishes only after them (the stats snapshot alone can look settled before an abort is seen)."""
    outs = [o async for o in engine.generate("barrier", [2], SamplingParams(max_tokens=1))]
    assert [o.finished for o in outs] == [True]


def test_generate_yields_every_token_in_order():
    async def body(engine, fake):
        outs = [o async for o in engine.generate("a", [1, 2, 3], SamplingParams(max_tokens=5))]
        assert [len(o.token_ids) for o in outs] == [1, 2, 3, 4, 5]
        assert [o.finished for o in outs] == [False] * 4 + [True]
        assert outs[-1].text == scripted_text([1, 2, 3], 5) and outs[-1].finish_reason == "length"
        await settled(engine)

    run(body)


def test_more_requests_than_the_running_limit_all_finish():
    async def one(engine, i):
        outs = [o async for o in engine.generate(f"r{i}", [i + 1], SamplingParams(max_tokens=6))]
        return outs[-1].text

    async def body(engine, fake):
        texts = await asyncio.gather(*(one(engine, i) for i in range(10)))
        assert texts == [scripted_text([i + 1], 6) for i in range(10)]
        assert fake.peak <= 2 * 2  # never more than max_concurrency=2 requests' blocks at once
        await settled(engine)

    run(body, max_concurrency=2, block_size=4)


def test_submit_raises_what_the_engine_rejects():
    async def body(engine, fake):
        with pytest.raises(WispError, match="vocabulary"):
            await engine.submit("bad", [1, 9999], SamplingParams(max_tokens=2))
        stream = await engine.submit("dup", [1], SamplingParams(max_tokens=50))
        with pytest.raises(WispError, match="already running"):
            await engine.submit("dup", [1], SamplingParams(max_tokens=2))
        stream.close()
        await settled(engine)

    run(body, step_delay=0.001)


def test_breaking_out_closing_and_cancelling_abort():
    async def body(engine, fake):
        async with await engine.submit("closed", [1], SamplingParams(max_tokens=100)) as stream:
            await stream.__anext__()
        gen = engine.generate("broken", [2], SamplingParams(max_tokens=100))
        async for _ in gen:
            break
        await gen.aclose()

        async def consume():
            async for _ in engine.generate("cancelled", [3], SamplingParams(max_tokens=100)):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await settled(engine)
        assert {"closed", "broken", "cancelled"} <= set(fake.aborted)
        assert fake.used == 0 and fake.cached + (fake.total - fake.used - fake.cached) == fake.total

    run(body, step_delay=0.002)


def test_an_abandoned_stream_is_aborted_when_collected():
    async def body(engine, fake):
        stream = await engine.submit("dropped", [1], SamplingParams(max_tokens=100))
        await stream.__anext__()
        del stream
        await handled(engine)
        await settled(engine)
        assert "dropped" in fake.aborted

    run(body, step_delay=0.002)


def test_cancelled_while_waiting_for_admission_is_undone():
    async def body(engine, fake):
        task = asyncio.create_task(engine.submit("early", [1], SamplingParams(max_tokens=100)))
        await asyncio.sleep(0)  # the add is posted; cancel before admission resolves
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await handled(engine)
        await settled(engine)
        # undone, not left to run (an aborted and a finished request look alike once settled): the engine
        # was told to abort it, and it stopped well short of its 100 tokens (1 s of steps at this delay)
        assert fake.aborted == ["early"]
        assert fake.tokens_decoded < 100

    run(body, step_delay=0.01)


def test_shutdown_ends_running_streams_and_refuses_new_ones():
    fake = FakeEngine(step_delay=0.002)
    engine = AsyncEngine(fake)
    engine.start()

    async def body():
        stream = await engine.submit("long", [1], SamplingParams(max_tokens=100))
        await stream.__anext__()
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(EngineShutDown):
            async for _ in stream:
                pass
        with pytest.raises(EngineShutDown):
            await engine.submit("late", [1], SamplingParams(max_tokens=2))

    asyncio.run(asyncio.wait_for(body(), 30))
    assert not engine.healthy and "long" in fake.aborted and fake.used == 0
    assert engine.stats()["num_running"] == 0


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on():
    async def body(engine, fake):
        fake.fail_steps = 1  # the engine is idle: the next step is this request's first
        stream = await engine.submit("unlucky", [1], SamplingParams(max_tokens=5))
        with pytest.raises(EngineShutDown, match="injected"):
            async for _ in stream:
                pass
        outs = [o async for o in engine.generate("next", [1], SamplingParams(max_tokens=3))]
        assert outs[-1].finished and engine.healthy
        await settled(engine)

    run(body)


def test_observers_see_ttft_inter_token_and_finish():
    class Recorder:
        def __init__(self):
            self.ttft, self.itl, self.finished = [], [], []

        def observe_ttft(self, s):
            self.ttft.append(s)

        def observe_inter_token(self, s):
            self.itl.append(s)

        def observe_finished(self, reason, prompt_tokens, completion_tokens):
            self.finished.append((reason, prompt_tokens, completion_tokens))

    rec = Recorder()

    async def body(engine, fake):
        engine.add_observer(rec)
        [o async for o in engine.generate("a", [1, 2], SamplingParams(max_tokens=4))]
        stream = await engine.submit("b", [3], SamplingParams(max_tokens=100))
        await stream.__anext__()
        stream.close()
        await settled(engine)

    run(body, step_delay=0.001)
    assert len(rec.ttft) == 2 and all(t > 0 for t in rec.ttft)
    assert len(rec.itl) >= 3 and all(t >= 0 for t in rec.itl)
    assert rec.finished[0] == ("length", 2, 4) and rec.finished[1][0] == "abort"


def test_shutdown_before_start_refuses_queued_requests():
    engine = AsyncEngine(FakeEngine())

    async def body():
        task = asyncio.create_task(engine.submit("queued", [1], SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.01)
        engine.shutdown()
        with pytest.raises(EngineShutDown):
            await task

    asyncio.run(asyncio.wait_for(body(), 10))
