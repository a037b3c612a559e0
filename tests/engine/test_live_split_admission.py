"""The live split with its KV floor following the requests in flight (`admission_window`): the pool goes below
W x L while fewer requests run and grows back before more are admitted; whatever the demand, the running requests
always fit the pool (never preempted), the engine's floor is the admission limit's, and every output stays
bit-identical to a run without the controller."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.plan.split import SplitProblem

W, LEN, BLOCK = 4, 64, 16
R = LEN // BLOCK  # blocks of one request's whole context
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def _engine(device: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model="demo", device=device, mode="paged", expert_cap=4, max_model_len=LEN,
                                  max_concurrency=W, kv_blocks=W * R, max_num_batched_tokens=32, kv_block_size=BLOCK))


def _controller(engine: LLMEngine, window: int = 3) -> SplitController:
    """Expert slots priced far above KV blocks: with fewer requests in flight it shrinks the pool to their floor."""
    cfg = engine.model_config
    slot = len(cfg.moe_layer_ids) * cfg.expert_bytes
    problem = SplitProblem(budget_bytes=4 * slot + W * R * engine.block_bytes, slot_bytes=slot,
                           block_bytes=engine.block_bytes, expert_cost=1e-3, kv_cost=1e-6, min_cap=cfg.top_k,
                           max_cap=cfg.num_experts, kv_floor=R)
    config = ControllerConfig(problem, resolve_every=2, min_gain=0.0, half_life=None, min_observations=1,
                              admission_window=window)
    return SplitController(config, expert_cap=4, kv_blocks=W * R)


def _prompt(i: int) -> list[int]:
    return [(13 * i + 7 * j) % 250 for j in range(20 + 5 * (i % 4))]


def _serve(engine: LLMEngine, waves: list[int]) -> dict:
    """Waves of requests, each sent once the one before has finished; checks the admission invariants after every step."""
    out, n = {}, 0
    for size in waves:
        for _ in range(size):
            engine.add_request(f"r{n}", _prompt(n), PARAMS, keep_logits=True)
            out[f"r{n}"] = engine.requests[f"r{n}"]
            n += 1
        while engine.has_unfinished():
            engine.step()
            s = engine.scheduler
            if engine.live_split is not None:
                assert len(s.running) <= s.max_running and 1 <= s.max_running <= W
                assert engine.floor_blocks == s.max_running * R <= engine.pool.num_blocks
                assert engine.pool.num_blocks == engine.live_split.controller.kv_blocks
            engine.pool.check_integrity([q.block_table for q in s.running]) if s.running else None
    return {rid: (q.output_ids, q.logits) for rid, q in out.items()}


def test_the_pool_follows_the_requests_in_flight_and_outputs_stay_the_same(device):
    waves = [1, 1, W, 1]
    ref = _serve(_engine(device), waves)
    engine = _engine(device)
    engine.set_live_split(_controller(engine))
    got = _serve(engine, waves)
    for rid, (tokens, logits) in ref.items():
        assert got[rid][0] == tokens and all(torch.equal(a, b) for a, b in zip(got[rid][1], logits))
    assert engine.stats()["preemptions"] == 0
    events = engine.live_split.events
    below = [e for e in events if e.resize.to_kv_blocks < W * R]
    forced = [e for e in events if e.resize.reason.startswith("admission")]
    assert below and below[0].admission_limit < W  # one request in flight: the pool went below W x L
    assert forced and forced[0].admission_limit == W  # W at once: it grew back before admitting them
    state = engine.live_split.state()
    assert state.admission_limit == engine.scheduler.max_running and state.admission_floor_blocks >= R


@settings(max_examples=6, deadline=None)
@given(waves=st.lists(st.integers(1, W + 2), min_size=1, max_size=4), window=st.integers(1, 6))
def test_no_demand_ever_preempts_or_starves_a_request(waves, window):
    engine = _engine("cpu")
    engine.set_live_split(_controller(engine, window))
    _serve(engine, waves)  # the invariants hold after every step, and every wave finishes
    assert engine.stats()["preemptions"] == 0 and not engine.requests


def test_a_fixed_floor_keeps_the_engine_admitting_w(device):
    engine = _engine(device)
    problem = replace(_controller(engine).config.problem, kv_floor=W * R)  # no admission window: W x L throughout
    config = ControllerConfig(problem, resolve_every=2, min_gain=0.0, half_life=None, min_observations=1)
    engine.set_live_split(SplitController(config, expert_cap=4, kv_blocks=W * R))
    engine.add_request("a", _prompt(0), PARAMS)
    while engine.has_unfinished():
        engine.step()
        assert engine.pool.num_blocks >= W * R
    assert engine.scheduler.max_running == W and engine.floor_blocks == W * R
    assert engine.live_split.admission is None


def test_a_budget_without_room_for_one_request_is_refused(device):
    engine = _engine(device)
    cfg = engine.model_config
    slot = len(cfg.moe_layer_ids) * cfg.expert_bytes
    problem = SplitProblem(cfg.top_k * slot + (R - 1) * engine.block_bytes, slot, engine.block_bytes, 1e-3, 1e-6,
                           cfg.top_k, cfg.num_experts, kv_floor=1)
    controller = SplitController(ControllerConfig(problem, admission_window=2), cfg.top_k, R - 1)
    with pytest.raises(ValueError, match="one request"):
        engine.set_live_split(controller)
