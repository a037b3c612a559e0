"""The online split controller on a live engine: it resizes between steps while requests run, every
output stays bit-identical to a run without it, nothing is preempted, and the engine's pools always
equal the controller's split."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.engine.split_controller.controller import ControllerConfig, SplitController
from wisp.plan.split import SplitProblem
from wisp.trace.format import RoutingTrace
from wisp.trace.session_replay import SessionRoutingReplay

PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
# three "sessions" of two turns each; turn 2 extends turn 1, so the prefix cache has something to keep
TURNS = [[(11 * i + 5 * s) % 250 for i in range(40 + 20 * s)] for s in range(3)]
PROMPTS = TURNS + [t + [(3 * i) % 250 for i in range(24)] for t in TURNS]


def _engine(device: str, attention_backend: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model="demo", device=device, mode="paged", expert_cap=4, max_model_len=128,
                                  max_concurrency=2, kv_blocks=16, max_num_batched_tokens=32,
                                  attention_backend=attention_backend))


def _controller(engine: LLMEngine) -> SplitController:
    cfg = engine.model_config
    slot = len(cfg.moe_layer_ids) * cfg.expert_bytes
    problem = SplitProblem(budget_bytes=12 * slot + 16 * engine.block_bytes, slot_bytes=slot,
                           block_bytes=engine.block_bytes, expert_cost=1e-3, kv_cost=1e-3, min_cap=cfg.top_k,
                           max_cap=cfg.num_experts, kv_floor=engine.floor_blocks)
    config = ControllerConfig(problem, resolve_every=3, min_gain=0.0, half_life=None, min_observations=1)
    return SplitController(config, expert_cap=4, kv_blocks=problem.kv_blocks(4))  # starts KV-heavy


def _serve(engine: LLMEngine, replay: SessionRoutingReplay | None, check: bool = True) -> dict:
    """Serve PROMPTS; with `check`, after every step the pools equal the controller's split (reading the
    engine's stats, which flush what the live split holds)."""
    seqs = {}
    for j, prompt in enumerate(PROMPTS):
        rid = f"r{j}"
        engine.add_request(rid, prompt, PARAMS, keep_logits=True)
        if replay is not None:
            replay.assign(rid, 17 * (j % 3))
        seqs[rid] = engine.requests[rid]
    while engine.has_unfinished():
        engine.step()
        if check and engine.live_split is not None:
            c = engine.live_split.controller
            assert engine.pool.num_blocks == c.kv_blocks and set(engine.stats()["expert_caps"].values()) == {c.expert_cap}
            engine.pool.check_integrity([s.block_table for s in engine.scheduler.running])
    return {rid: (s.output_ids, s.logits) for rid, s in seqs.items()}


def _replay(engine: LLMEngine) -> SessionRoutingReplay:
    cfg = engine.model_config
    rng = np.random.default_rng(0)
    ids = np.stack([np.stack([rng.permutation(8)[: cfg.top_k] for _ in cfg.moe_layer_ids]) for _ in range(97)])
    trace = RoutingTrace(ids, layers=list(cfg.moe_layer_ids), num_experts=cfg.num_experts)
    replay = SessionRoutingReplay(trace, list(cfg.moe_layer_ids), cfg.num_experts, cfg.top_k, engine.device, 64)
    engine.runner.set_routing_replay(replay)
    return replay


@pytest.mark.parametrize("routing", ["log", "replay"])
def test_live_resizes_keep_every_output(device, attention_backend, routing):
    ref_engine = _engine(device, attention_backend)
    ref_replay = _replay(ref_engine) if routing == "replay" else None
    ref = _serve(ref_engine, ref_replay)
    engine = _engine(device, attention_backend)
    replay = _replay(engine) if routing == "replay" else None
    engine.set_live_split(_controller(engine))
    got = _serve(engine, replay)
    events = engine.live_split.events
    assert events, "the controller never resized"
    assert all(e.stall_s >= 0 and e.resize.to_kv_blocks >= engine.floor_blocks for e in events)
    for rid, (tokens, logits) in ref.items():
        assert got[rid][0] == tokens
        assert all(torch.equal(a, b) for a, b in zip(got[rid][1], logits))
    assert engine.stats()["preemptions"] == 0
    assert engine.runner.graph_steps > 0 or not engine.runner.graphs_enabled()  # decode kept its CUDA graphs
    assert engine.live_split.routing_rows_lost == 0  # drained before the ring could fill
    state = engine.live_split.state()
    assert state.resizes == len(events) and state.admission_floor_blocks == engine.floor_blocks
    engine.set_live_split(None)
    assert not engine.runner.observers
    if engine.load_control is None:  # nobody else reads the routing: the log is gone
        assert engine.model.routing_log is None
    else:  # load control still reads it, and only load control
        assert engine.model.routing_log is engine.feed and len(engine.feed.subscribers) == 1


def test_replay_routes_each_session_from_its_offset(device):
    engine = _engine(device, "torch")
    replay = _replay(engine)
    engine.add_request("a", PROMPTS[0], PARAMS)
    replay.assign("a", 5)
    engine.step()
    assert np.array_equal(replay.last_rows, replay.rows[5 : 5 + 32])  # the first 32-token chunk


def test_the_routing_log_is_drained_before_it_fills(device):
    engine = _engine(device, "torch")
    controller = _controller(engine)
    controller.config = replace(controller.config, resolve_every=10_000)  # no re-solve: only a full ring drains it
    engine.set_live_split(controller)
    for j, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{j}", prompt, PARAMS)
    while engine.has_unfinished():
        engine.step()
    assert engine.live_split.routing_rows_lost == 0
    engine.live_split.flush()  # drained steps are held until a re-solve (there is none here) or a flush
    assert controller._experts.total > 0  # what was drained reached the controller


@pytest.mark.parametrize("routing", ["log", "replay"])
def test_steps_held_until_a_re_solve_decide_as_steps_fed_one_by_one(device, monkeypatch, routing):
    """The live split feeds the controller in bulk before each re-solve; fed after every step instead
    (nothing held: HELD_TOKENS = 1) it reaches the same curves and so the same resizes."""
    import wisp.engine.live_split as live_split

    def resizes() -> list:
        engine = _engine(device, "torch")
        replay = _replay(engine) if routing == "replay" else None
        engine.set_live_split(_controller(engine))
        _serve(engine, replay, check=False)
        return [e.resize for e in engine.live_split.events]

    held = resizes()
    monkeypatch.setattr(live_split, "HELD_TOKENS", 1)
    assert held and resizes() == held


def test_the_controller_arm_keeps_the_graphs_it_starts_with(device):
    """Registering a controller at the engine's own split changes nothing the decode runs with: no
    routing observer (which would force eager decode) and no graph re-capture."""
    engine = _engine(device, "torch")
    _replay(engine)
    captures = []
    capture = engine.runner.capture_graphs
    engine.runner.capture_graphs = lambda: (captures.append(1), capture())
    cfg = engine.model_config
    slot = len(cfg.moe_layer_ids) * cfg.expert_bytes
    problem = SplitProblem(4 * slot + 16 * engine.block_bytes, slot, engine.block_bytes, 1e-3, 1e-3, cfg.top_k,
                           cfg.num_experts, engine.floor_blocks)
    engine.set_live_split(SplitController(ControllerConfig(problem), 4, 16))
    assert not captures and not engine.runner.observers
