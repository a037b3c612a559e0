"""Hybrid mode end to end: misses served on the CPU change nothing on a CPU run (the same kernel computes
every pair: torch.equal to resident), and stay close to resident on a GPU (the CPU's rounding of its pairs)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_mode_identity import LONG_PROMPT, SHORT_PROMPT, run
from wisp import LLM, SamplingParams
from wisp.core.learners.hybrid_costs import HybridCosts

CPU_CHEAP = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))  # light experts go to the CPU


@pytest.mark.parametrize("cap", [2, 0])  # 0: no slots, the GPU reads in place what the CPU does not compute
def test_hybrid_equals_resident_on_the_cpu_and_is_close_on_a_gpu(hf_checkpoints, device, moe_backend, attention_backend,
                                                                 cap):
    path = hf_checkpoints["mixtral"]
    for prompt in (LONG_PROMPT, SHORT_PROMPT):
        _, ref_prefill, ref = run(path, "resident", None, "float32", prompt, device, moe_backend, attention_backend)
        llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="hybrid",
                  expert_cap=cap, dtype="float32", hybrid_costs=CPU_CHEAP)
        prefill = llm.prompt_logits(prompt)
        out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True), return_logits=True)[0]
        stats = llm.stats()
        assert stats["mode"] == ("hybrid" if cap else "hybrid-zero-copy") and stats["expert_cpu_computed"] > 0
        assert stats["hybrid_costs"]["copy_s"] == CPU_CHEAP.copy_s  # what `wisp plan --hybrid-costs` can read
        assert stats["hybrid_cpu_steps"]["steps"] > 0 and stats["hybrid_cpu_factor"] > 0
        if cap:
            assert stats["expert_misses"] == stats["expert_loads"] + stats["expert_cpu_computed"]
        else:  # every routed expert is a miss; prefill chunks stream theirs through the staging buffers
            assert stats["expert_device_bytes"] == 0 and stats["expert_loads"] > 0
        if torch.device(device).type == "cpu":
            assert torch.equal(prefill, ref_prefill)
            assert out.token_ids == ref.token_ids
            assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
        else:
            torch.testing.assert_close(prefill, ref_prefill, rtol=1e-3, atol=1e-3)
            assert sum(a == b for a, b in zip(out.token_ids, ref.token_ids)) >= 14


def test_generate_cli_runs_hybrid(hf_checkpoints, device, capsys):
    """With slots, without, and without but with hot experts on the device (the decode steps under CUDA graphs
    serve their pairs from there: on a GPU, close to the others; on the CPU, the same tokens)."""
    import json

    from wisp.cli import main

    tokens = {}
    for cap, hot in (("2", "0"), ("0", "0"), ("0", "3")):
        code = main(["generate", "--model", str(hf_checkpoints["mixtral"]), "--device", device, "--mode", "hybrid",
                     "--expert-cap", cap, "--hot-experts", hot, "--prompt-ids", "5,17,99", "--max-tokens", "4", "--json"])
        assert code in (0, None)
        tokens[cap, hot] = json.loads(capsys.readouterr().out)["token_ids"]
    if device == "cpu":
        assert tokens["0", "3"] == tokens["0", "0"] == tokens["2", "0"]


def test_a_hybrid_engine_resizes_and_keeps_its_costs_and_kernel(hf_checkpoints, device, moe_backend, attention_backend):
    path = hf_checkpoints["mixtral"]
    _, _, ref = run(path, "resident", None, "float32", LONG_PROMPT, device, moe_backend, attention_backend)
    llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="hybrid",
              expert_cap=2, dtype="float32", hybrid_costs=CPU_CHEAP)
    stores = list(llm.engine.model.experts.values())
    kernels = {s.cpu.cpu_kernel for s in stores}
    outs = []
    for caps in (4, 3, 2):
        llm.engine.apply_plan([caps] * len(stores), llm.engine.pool.num_blocks)
        outs.append(llm.generate([LONG_PROMPT], SamplingParams(max_tokens=16, ignore_eos=True))[0].token_ids)
        assert all(s.residency.pager.capacity == caps and s.cpu.costs == CPU_CHEAP for s in stores)
        assert {s.cpu.cpu_kernel for s in stores} == kernels
    assert llm.stats()["expert_cpu_computed"] > 0
    if torch.device(device).type == "cpu":
        assert outs == [ref.token_ids] * 3


def test_steps_the_cpu_cannot_help_are_paged_steps_and_replay_cuda_graphs(hf_checkpoints, device, moe_backend,
                                                                          attention_backend):
    path = hf_checkpoints["mixtral"]
    _, _, ref = run(path, "resident", None, "float32", LONG_PROMPT, device, moe_backend, attention_backend)
    slow_cpu = HybridCosts(copy_s=1e-3, cpu_rows=(1,), cpu_s_at_rows=(1.0,))  # one CPU expert: 1000 copies
    llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="hybrid",
              expert_cap=2, dtype="float32", hybrid_costs=slow_cpu)
    model = llm.engine.model
    assert model.graph_step_ok(1)
    out = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    stats = llm.stats()
    assert out.token_ids == ref.token_ids and stats["expert_cpu_computed"] == 0  # paged mode, bit for bit
    paces = {id(s.cpu.pace) for s in model.experts.values()}
    assert len(paces) == 1 and next(iter(model.experts.values())).cpu.pace.step == model.steps_begun >= 16
    if llm.engine.runner.graphs_enabled():
        assert stats["graph_steps"] >= 15
    cheap = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="hybrid",
                expert_cap=2, dtype="float32", hybrid_costs=CPU_CHEAP)
    assert not cheap.engine.model.graph_step_ok(1)  # the CPU can help a batch of one: eager, split on the host


@pytest.mark.parametrize("cap", [2, 0])  # 0: no slots, the CPU's share by rank inside the graphs (RankShare)
def test_where_the_cpu_could_help_graph_and_eager_steps_are_both_measured(hf_checkpoints, device, moe_backend,
                                                                        attention_backend, cap):
    path = hf_checkpoints["mixtral"]
    llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="hybrid",
              expert_cap=cap, dtype="float32", hybrid_costs=CPU_CHEAP)
    runner = llm.engine.runner
    llm.generate([LONG_PROMPT], SamplingParams(max_tokens=32, ignore_eos=True))
    stats = llm.stats()
    if runner.graphs_enabled():  # at least 3 + 3 CPU-helped steps (the graph's pieces; 3 untimed), 1 + 1 graph steps
        # (1 + 3 unless one kind is decisively faster: StepKindChooser's `decisive`)
        assert runner.step_kinds.best(1) is not None and stats["graph_steps"] >= 2 and stats["piece_steps"] >= 6
        assert stats["expert_cpu_computed"] > 0
        assert runner.strategy.helped.name == ("pieces with CPU ranks" if cap == 0 else "pieces with eager experts")
    else:
        assert not runner.step_kinds.picks and stats["graph_steps"] == stats["piece_steps"] == 0


@pytest.mark.parametrize("mode, cap", [("hybrid", 0), ("zero-copy", None)])
def test_a_plan_for_an_engine_without_slots_says_it_has_none(hf_checkpoints, mode, cap):
    from wisp.errors import WispError

    llm = LLM(str(hf_checkpoints["mixtral"]), device="cpu", mode=mode, expert_cap=cap, dtype="float32",
              hybrid_costs=CPU_CHEAP if mode == "hybrid" else None)
    with pytest.raises(WispError, match=f"runs {'hybrid-zero-copy' if mode == 'hybrid' else mode}, with no slots"):
        llm.engine.apply_plan([2] * len(llm.engine.model.experts), llm.engine.pool.num_blocks)


def test_hybrid_without_slots_holds_as_many_hot_experts_as_asked_and_resizes_kv(hf_checkpoints, device, moe_backend,
                                                                                attention_backend):
    """`hold_hot_experts` (what `--vram-budget` sizes): each layer's bank and the KV pool between requests, graphs
    re-captured; tokens as before on the CPU (a hot pair is the same kernel on the same weights there); the
    bounds are one clear error each."""
    from wisp.errors import WispError

    path = hf_checkpoints["mixtral"]
    llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="hybrid",
              expert_cap=0, dtype="float32", hybrid_costs=CPU_CHEAP)
    engine, stores = llm.engine, list(llm.engine.model.experts.values())
    before = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    blocks = engine.pool.num_blocks
    for hot, kv in ((2, blocks + 5), (1, blocks + 2), (0, blocks)):
        engine.hold_hot_experts(hot, kv)
        assert engine.pool.num_blocks == kv and engine.config.hot_experts == hot
        assert all((s.hot.capacity if s.hot else 0) == hot for s in stores)
        after = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
        assert llm.stats().get("hot_experts", 0) == hot
        if torch.device(device).type == "cpu":
            assert after == before, hot
    with pytest.raises(WispError, match="within 0"):
        engine.hold_hot_experts(engine.model_config.num_experts + 1, blocks)
    with pytest.raises(WispError, match="KV pool too small"):  # the floor holds
        engine.hold_hot_experts(1, blocks - 1)
    paged = LLM(str(path), device="cpu", mode="paged", expert_cap=2, dtype="float32")
    with pytest.raises(WispError, match="hot experts are --mode hybrid-zero-copy's; this engine runs paged"):
        paged.engine.hold_hot_experts(1, paged.engine.pool.num_blocks)


def test_running_out_of_memory_holding_hot_experts_leaves_none_held(hf_checkpoints, monkeypatch):
    """A device OOM part way through `hold_hot_experts` leaves one consistent state, no hot experts anywhere,
    and the engine still serves."""
    llm = LLM(str(hf_checkpoints["mixtral"]), device="cpu", mode="hybrid", expert_cap=0, dtype="float32",
              hybrid_costs=CPU_CHEAP)
    engine, stores = llm.engine, list(llm.engine.model.experts.values())
    engine.hold_hot_experts(1, engine.pool.num_blocks)
    real = type(stores[1]).hold_hot

    def hold_hot(store, hot):
        if store is stores[1] and hot:
            raise torch.OutOfMemoryError("no room for the bank")
        real(store, hot)

    monkeypatch.setattr(type(stores[1]), "hold_hot", hold_hot)
    with pytest.raises(torch.OutOfMemoryError):
        engine.hold_hot_experts(2, engine.pool.num_blocks)
    assert all(s.hot is None for s in stores) and engine.config.hot_experts == 0
    assert len(llm.generate([LONG_PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids) == 4
