"""Decode steps replayed from CUDA graphs equal the eager engine bit for bit (GPU machine only).

Every expert mode, bfloat16, several requests at once so the batch size changes while they run; the
graph engine must have replayed graphs and the eager engine none; a request's logits must not depend
on its batch (DeepSeek-V2's latent attention too); paged counters at batch 1 equal the host pager's; a
step replayed as pieces (hybrid mode's CPU-helped steps) equals the whole graph when the same experts run
between the pieces. The strategies (`wisp.engine.decode`) are captured here directly, driven by a stand-in
runner whose "sequences" are a step's (tokens, positions, tables) themselves.
"""

from __future__ import annotations

import pytest
import torch

from wisp.config import EngineConfig
from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.engine.decode.cpu_ranks import PiecesWithCpuRanks
from wisp.engine.decode.graphs import GraphCapture, GraphInputs
from wisp.engine.decode.pieces import PiecesWithEagerExperts
from wisp.engine.decode.whole_graph import WholeGraph
from wisp.engine.engine import LLMEngine
from wisp.engine.kv_cache import DecodeBatchKV
from wisp.engine.sampling import SamplingParams

if not torch.cuda.is_available():
    pytest.skip("CUDA graphs need a CUDA device (run on the GPU machine)", allow_module_level=True)

PROMPTS = [[(5 * i + 1) % 250 for i in range(n)] for n in (3, 21, 40)]
MODES = [("paged", 4), ("paged", 6), ("resident", None), ("offload", None), ("zero-copy", None)]


class StepRunner:
    """A stand-in `DecodeRunner`: a step is given as its (tokens, positions, tables)."""

    @staticmethod
    def graph_inputs(step):
        return step

    def count(self, kind, batch_size):
        pass


def captured(eng: LLMEngine, scratch_block: int, *kinds):
    """`kinds` captured for batches of 1 and 2 (4 blocks a table), in one pool; (their inputs, the strategies)."""
    model = eng.model
    inputs = GraphInputs(model.device, 2, 4, scratch_block)
    strategies = [kind(model, eng.kv, inputs) for kind in kinds]
    capture = GraphCapture(torch.cuda.Stream())
    model.lru_state_on("device")
    with torch.cuda.device(model.device):
        for b in (2, 1):
            for strategy in strategies:
                strategy.capture(b, capture)
    return inputs, strategies


def engine(mode, cap, eager, model="demo", **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, device="cuda", mode=mode, expert_cap=cap, dtype="bfloat16",
                                  max_model_len=128, max_concurrency=4, enforce_eager=eager, **kw))


def run(eng: LLMEngine, prompts, max_tokens=(9, 14, 6)) -> list[list[torch.Tensor]]:
    seqs = []
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens)):
        eng.add_request(f"r{i}", prompt, SamplingParams(max_tokens=n, ignore_eos=True), keep_logits=True)
        seqs.append(eng.requests[f"r{i}"])
        eng.step()  # staggered arrivals: batch sizes 1, 2, 3 all occur
    while eng.has_unfinished():
        eng.step()
    return [s.logits for s in seqs]


@pytest.mark.parametrize("mode,cap", MODES)
def test_graph_decode_equals_eager(mode, cap):
    graphed, eager = engine(mode, cap, False), engine(mode, cap, True)
    assert graphed.runner.strategy.captured and not eager.runner.strategy.captured
    a, b = run(graphed, PROMPTS), run(eager, PROMPTS)
    assert graphed.stats()["graph_steps"] > 0 and eager.stats()["graph_steps"] == 0
    for la, lb in zip(a, b):
        assert len(la) == len(lb)
        for step, (x, y) in enumerate(zip(la, lb)):
            assert torch.equal(x, y), (mode, cap, step)


@pytest.mark.parametrize("mode,cap", [("resident", None), ("paged", 4)])
def test_latent_attention_decodes_from_graphs_with_the_eager_bits(hf_checkpoints, mode, cap):
    """DeepSeek-V2 (latent attention on `wisp.engine.triton_mla_attention`) captures its decode steps too; they
    equal the eager engine's, and a request's logits do not depend on its batch."""
    path = str(hf_checkpoints["deepseek_v2"])
    prompts = [[t % 128 for t in p] for p in PROMPTS]  # the tiny model's vocabulary
    graphed, eager = engine(mode, cap, False, path), engine(mode, cap, True, path)
    assert graphed.kv.value_dim is not None and graphed.runner.strategy.captured
    a, b = run(graphed, prompts), run(eager, prompts)
    assert graphed.stats()["graph_steps"] > 0 and eager.stats()["graph_steps"] == 0
    for la, lb in zip(a, b):
        assert len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))
    alone = run(engine(mode, cap, False, path), prompts[1:2], (14,))[0]
    assert all(torch.equal(x, y) for x, y in zip(alone, a[1]))


def test_a_request_is_batch_invariant_under_graphs():
    alone = run(engine("paged", 4, False), PROMPTS[1:2], (14,))[0]
    batched = run(engine("paged", 4, False), PROMPTS)[1]
    assert all(torch.equal(x, y) for x, y in zip(alone, batched))


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS])
def test_paged_counters_match_the_host_pager(prompts):
    """At batch 1, and with three requests at C = 4 and top-4 (steps of 2 and 3 rows wider than the slots,
    decided on the device, `wisp.core.experts.expert_major_on_device`, against the eager host decision)."""
    graphed, eager = (engine("paged", 4, e, load_control="off") for e in (False, True))
    run(graphed, prompts), run(eager, prompts)
    sg, se = graphed.stats(), eager.stats()
    assert sg["graph_steps"] > 0
    for key in ("expert_hits", "expert_misses", "expert_evictions", "bytes_h2d", "moe_steps"):
        assert sg[key] == se[key], key


def test_plan_resize_recaptures_graphs():
    eng = engine("paged", 6, False)
    before = run(eng, PROMPTS[:1], (8,))[0]
    eng.apply_plan([4] * len(eng.model.experts), eng.pool.num_blocks + 3)
    assert eng.runner.strategy.captured
    after = run(eng, PROMPTS[:1], (8,))[0]
    assert all(torch.equal(x, y) for x, y in zip(before, after))


@pytest.mark.parametrize("mode,cap", [("resident", None), ("zero-copy", None), ("paged", 4)])
def test_a_step_replayed_as_pieces_equals_the_whole_graph(mode, cap):
    eng = engine(mode, cap, False)
    model, blocks = eng.model, eng.pool.allocate(3)
    _, (graph, graphs) = captured(eng, blocks[2], WholeGraph, PiecesWithEagerExperts)
    moe_layers = sum(lw.router is not None for lw in model.layers)
    assert set(graphs.pieces) == {1, 2} and len(graphs.pieces[2]) == moe_layers + 1
    tables = [[blocks[0]], [blocks[1]]]
    for position in range(6):
        tokens = [7 + position, 100 + 3 * position]
        whole = graph.replay(StepRunner(), (tokens, [position] * 2, tables)).clone()
        pieces = graphs.replay(StepRunner(), (tokens, [position] * 2, tables), lambda p: model.routed_experts(p, graph_safe=True))
        assert torch.equal(whole, pieces), position
        one = graphs.replay(StepRunner(), (tokens[:1], [position], tables[:1]), lambda p: model.routed_experts(p, graph_safe=True))
        assert torch.equal(one[0], whole[0]), position  # and batch invariant


def test_a_hybrid_step_replayed_as_pieces_equals_its_eager_step():
    """Hybrid with no slots (stateless: the CPU assignment depends only on the routing and the costs, fixed here):
    the pieces with the experts between them, the CPU computing most, equal the same step run eagerly."""
    cpu_cheap = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))
    eng = engine("hybrid", 0, False, hybrid_costs=cpu_cheap)
    model, blocks = eng.model, eng.pool.allocate(3)
    next(iter(model.experts.values())).cpu.pace.learn = False  # one pace for every layer: the costs stay as given
    inputs, (graphs,) = captured(eng, blocks[2], PiecesWithEagerExperts)
    tables = [[blocks[0]], [blocks[1]]]
    for position in range(6):
        tokens = [7 + position, 100 + 3 * position]
        model.lru_state_on("host")
        pieces = graphs.replay(StepRunner(), (tokens, [position] * 2, tables), model.routed_experts).clone()
        assert all(store.cpu.last_assignment.to_cpu for store in model.experts.values())  # the CPU helped every layer
        kv = DecodeBatchKV(eng.kv, inputs.tables[:2], inputs.positions[:2])  # the same staged inputs
        eager = model.logits(model.forward_batch(inputs.tokens[:2], inputs.positions[:2], kv))
        assert torch.equal(pieces, eager), position


@pytest.mark.parametrize("hot", [0, 2])
def test_a_rank_share_step_replayed_equals_the_same_share_run_eagerly(hot):
    """Hybrid with no slots replays the CPU's share of ranks between the graphs (`PiecesWithCpuRanks`): for each share,
    the same as each layer's RankShare run eagerly between eager pieces, and a token's logits do not
    depend on its batch. With hot experts, held in the bank after the graphs were captured (their pairs the
    GPU's from there, whatever their rank)."""
    eng = engine("hybrid", 0, False, hybrid_costs=HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4)),
                 hot_experts=hot)
    model, blocks = eng.model, eng.pool.allocate(3)
    inputs, (graphs,) = captured(eng, blocks[2], PiecesWithCpuRanks)
    for store in model.experts.values() if hot else ():
        store.hot.scores[[1, 4]] = 1e9  # held whatever the test routes
        assert store.hot.refresh() == 2
    assert set(graphs.shares) == set(model.experts) and graphs.gpu_graphs[1] and graphs.gpu_graphs[2]
    tables, top_k = [[blocks[0]], [blocks[1]]], model.config.top_k
    for position in range(2 * top_k):
        cpu_ranks = position % (top_k + 1)
        for share in graphs.shares.values():
            share.worker.set_share(cpu_ranks)
        tokens = [7 + position, 100 + 3 * position]
        replayed = graphs.replay(StepRunner(), (tokens, [position] * 2, tables)).clone()
        alone = graphs.replay(StepRunner(), (tokens[:1], [position], tables[:1]))[0].clone()
        kv = DecodeBatchKV(eng.kv, inputs.tables[:2], inputs.positions[:2])
        piece = model.forward_piece(inputs.tokens[:2], inputs.positions[:2], kv)
        while piece.layer is not None:
            share = graphs.shares[piece.layer]
            share.captured.send(piece.hidden, piece.topk_ids)
            per_k = share.captured.gpu_pairs(piece.hidden, piece.topk_ids)
            torch.cuda.synchronize()
            share.worker.serve(2, None, None)
            piece = model.forward_piece(inputs.tokens[:2], inputs.positions[:2], kv, piece,
                                        share.captured.merge(per_k, piece.topk_ids, piece.topk_weights, model.dtype))
        eager = model.logits(piece.x)
        for share in graphs.shares.values():
            share.worker.refresh_hot()
        assert torch.equal(replayed, eager), (position, cpu_ranks)
        assert torch.equal(alone, replayed[0]), (position, cpu_ranks)


def test_a_rank_share_step_counts_and_paces_every_layer_once():
    """`PiecesWithCpuRanks` accounts for each layer after queuing the next one's graphs: every layer still counts one
    step and feeds the (shared) pace once a step, the last one too, with its GPU pairs timed on the device."""
    eng = engine("hybrid", 0, False, hybrid_costs=HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4)))
    model, blocks = eng.model, eng.pool.allocate(3)
    _, (graphs,) = captured(eng, blocks[2], PiecesWithCpuRanks)
    stores, top_k = list(model.experts.values()), model.config.top_k
    pace = stores[0].cpu.pace
    assert top_k >= 2 and all(store.cpu.pace is pace for store in stores)
    cpu_ranks = top_k // 2  # both servers have pairs
    for share in graphs.shares.values():
        share.worker.set_share(cpu_ranks)
    counted, paced, ranks, gpu_s = [s.counters.steps for s in stores], pace.totals.steps, pace.totals.cpu_ranks, pace.totals.gpu_s
    for position in range(3):
        graphs.replay(StepRunner(), ([7 + position], [position], [[blocks[0]]]))
    assert [s.counters.steps - c for s, c in zip(stores, counted)] == [3] * len(stores)
    assert pace.totals.steps - paced == 3 * len(stores)
    assert pace.totals.cpu_ranks - ranks == 3 * len(stores) * cpu_ranks and pace.totals.gpu_s > gpu_s
