"""LLMEngine: admission floor, prefix caching across turns, resize, preemption by recompute, no leaks."""

from __future__ import annotations

import random

import pytest
import torch

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.fixture
def make_engine(device, attention_backend):
    def make(**kw) -> LLMEngine:
        return _engine(device, attention_backend=attention_backend, **kw)

    return make


def _engine(device: str, **kw) -> LLMEngine:
    opts = dict(model="demo", device=device, mode="paged", expert_cap=6, max_model_len=256, max_concurrency=4)
    opts.update(kw)
    return LLMEngine(EngineConfig(**opts))


def run_all(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()


def generate(engine: LLMEngine, prompt: list[int], params=GREEDY, rid="r"):
    engine.add_request(rid, prompt, params, keep_logits=True)
    seq = engine.requests[rid]
    run_all(engine)
    return seq


def test_admission_floor_refuses_a_small_pool(make_engine):
    with pytest.raises(WispError) as err:
        make_engine(max_concurrency=4, max_model_len=256, kv_blocks=63)  # floor: 4 x 256/16 = 64 blocks
    msg = str(err.value)
    assert "--max-concurrency 4 x --max-model-len 256" in msg and "64 blocks" in msg and "63 blocks" in msg
    assert "\n" not in msg
    engine = make_engine(max_concurrency=4, max_model_len=256, kv_blocks=64)
    assert engine.stats()["kv_blocks_total"] == 64


def test_kv_bytes_sizes_the_pool(make_engine):
    probe = make_engine()
    engine = make_engine(kv_bytes=100 * probe.block_bytes + 7)
    assert engine.pool.num_blocks == 100


def test_second_turn_computes_only_new_tokens_and_matches_no_cache(make_engine):
    bs = 16
    turn1 = [(5 * i + 1) % 250 for i in range(37)]
    cached = make_engine()
    uncached = make_engine(enable_prefix_caching=False)
    first = generate(cached, turn1, rid="t1")
    turn2 = turn1 + first.output_ids + [7, 8, 9, 10, 11]
    before = cached.stats()
    second = generate(cached, turn2, rid="t2")
    after = cached.stats()
    hit = after["prefix_hit_tokens"] - before["prefix_hit_tokens"]
    miss = after["prefix_miss_tokens"] - before["prefix_miss_tokens"]
    computed_turn1 = len(turn1) + len(first.output_ids) - 1  # the last sampled token never went through the model
    assert hit == (computed_turn1 // bs) * bs
    assert miss == len(turn2) - hit and miss < bs + 5 + 1
    ref = generate(uncached, turn2, rid="t2")
    assert uncached.stats()["prefix_hit_tokens"] == 0
    assert second.output_ids == ref.output_ids
    assert all(torch.equal(a, b) for a, b in zip(second.logits, ref.logits))


@pytest.mark.slow
def test_resize_shrinks_and_grows_with_identical_outputs(make_engine):
    engine = make_engine(max_concurrency=2, max_model_len=128)  # floor 16 blocks
    prompts = [[(3 * i + j) % 250 for i in range(20 + j)] for j in range(3)]
    base = [generate(engine, p, rid=f"a{j}").output_ids for j, p in enumerate(prompts)]
    engine.resize_kv(40)
    assert engine.stats()["kv_blocks_total"] == 40 and engine.kv.num_blocks == 40 == engine.kv.k[0].shape[0]
    grown = [generate(engine, p, rid=f"b{j}").output_ids for j, p in enumerate(prompts)]
    engine.resize_kv(16)
    shrunk = [generate(engine, p, rid=f"c{j}").output_ids for j, p in enumerate(prompts)]
    assert base == grown == shrunk
    with pytest.raises(WispError, match="admission floor|needs"):
        engine.resize_kv(15)
    engine.pool.check_integrity()


@pytest.mark.slow
def test_preemption_by_recompute_loses_nothing_and_changes_nothing(make_engine):
    prompts = [[(7 * i + 11 * j) % 250 for i in range(10 + 3 * j)] for j in range(6)]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    roomy = make_engine(max_concurrency=6, max_model_len=64)
    tight = make_engine(max_concurrency=2, max_model_len=64)  # 8 blocks
    tight.scheduler.max_running = 6  # run more than the pool promises, to force preemptions
    for engine in (roomy, tight):
        for j, p in enumerate(prompts):
            engine.add_request(f"r{j}", p, params, keep_logits=True)
    seqs = {e: [e.requests[f"r{j}"] for j in range(6)] for e in (roomy, tight)}
    run_all(roomy)
    while tight.has_unfinished():
        tight.step()
        tight.pool.check_integrity([s.block_table for s in tight.scheduler.running])
    assert tight.stats()["preemptions"] > 0 and roomy.stats()["preemptions"] == 0
    for a, b in zip(seqs[roomy], seqs[tight]):
        assert a.output_ids == b.output_ids and len(b.output_ids) == 30
        assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))


@pytest.mark.slow
def test_random_requests_and_aborts_leave_no_leak(make_engine):
    engine = make_engine(max_concurrency=3, max_model_len=96)
    rng = random.Random(0)
    bases = [[rng.randrange(250) for _ in range(40)] for _ in range(3)]
    pending = []
    for i in range(60):
        prompt = rng.choice(bases)[: rng.randrange(1, 40)] + [rng.randrange(250) for _ in range(rng.randrange(0, 10))]
        params = SamplingParams(max_tokens=rng.randrange(1, 20), temperature=rng.choice([0.0, 1.0]), seed=i)
        engine.add_request(f"q{i}", prompt, params)
        pending.append(f"q{i}")
        for _ in range(rng.randrange(0, 3)):
            engine.step()
        if rng.random() < 0.3:
            engine.abort_request(rng.choice(pending))
        engine.pool.check_integrity([s.block_table for s in engine.scheduler.running])
    run_all(engine)
    s = engine.stats()
    assert s["num_running"] == s["num_waiting"] == 0 and s["kv_blocks_used"] == 0
    assert s["kv_blocks_free"] + s["kv_blocks_cached"] == s["kv_blocks_total"]
    assert s["prefix_hit_tokens"] > 0
    assert not engine.requests
    engine.pool.check_integrity([])


def test_request_validation(make_engine):
    engine = make_engine(max_model_len=64)
    with pytest.raises(WispError, match=r"prompt \(60 tokens\) \+ max_tokens \(10\) = 70 exceeds max-model-len 64"):
        engine.add_request("x", [1] * 60, SamplingParams(max_tokens=10))
    engine.add_request("y", [1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(WispError, match="already in use"):
        engine.add_request("y", [1, 2], SamplingParams(max_tokens=2))
    engine.abort_request("nope")  # unknown ids are ignored
    run_all(engine)


@pytest.mark.parametrize("mode, cap, concurrency, expected", [("paged", 4, 4, 4), ("paged", 8, 4, 4), ("paged", 16, 12, 12),
                                                              ("paged", 16, 3, 3), ("resident", None, 6, 6)])
def test_graphs_replay_decode_batches_wider_than_the_slots(make_engine, mode, cap, concurrency, expected):
    """demo: top-4 of 16. A paged store with staging rows runs a batch wider than its slots expert-major on the
    device, so graphs cover every batch up to min(cuda_graph_max_batch = 32, max_concurrency)."""
    engine = make_engine(mode=mode, expert_cap=cap, max_concurrency=concurrency)
    assert all(s.wide_in_graph for s in engine.model.experts.values()) == (mode == "paged")
    assert engine.runner.graph_max_batch() == expected


def test_stats_report_the_shared_staging_buffers(make_engine):
    """Paged and zero-copy modes keep two expert-sized staging buffers for wide steps, one pair for all layers."""
    paged, resident = make_engine(mode="paged", expert_cap=4), make_engine(mode="resident", expert_cap=None)
    zero_copy = make_engine(mode="zero-copy", expert_cap=None)
    expert = paged.model_config.expert_bytes
    assert paged.stats()["expert_staging_bytes"] == zero_copy.stats()["expert_staging_bytes"] == 2 * expert
    assert resident.stats()["expert_staging_bytes"] == 0
