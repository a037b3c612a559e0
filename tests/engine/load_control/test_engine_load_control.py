"""Load control inside the engine (demo model, 16 experts, top-4, paged): it holds requests back when their
working sets do not fit the slots, it never changes a request's tokens or logits (whatever the arrival order,
the cap or the wait bound), each step's routing reaches the right request's working set, and with the joint
working set fitting (C = N) or `--load-control off` the engine has none."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.load_control.step_costs import DecodeStepCosts
from wisp.engine.sampling import SamplingParams

PROMPTS = [[(7 * i + 3 * j) % 200 + 1 for j in range(5 + 3 * i)] for i in range(4)]


def engine(device, attention_backend, cap=4, control="on", wait_ms=30.0, mode="paged"):
    return LLMEngine(EngineConfig(model="demo", device=device, attention_backend=attention_backend, mode=mode,
                                  expert_cap=cap, max_model_len=96, max_concurrency=4, load_control=control,
                                  max_decode_wait_ms=wait_ms))


def run(eng, starts, max_tokens=12):
    """Add request i after starts[i] steps, run to the end; its tokens and logits, and per step (ready, chosen)."""
    gate, widths = eng.scheduler.decode_gate, []
    if gate is not None:
        def spy(ready):
            chosen = gate(ready)
            widths.append((len(ready), len(chosen)))
            return chosen
        eng.scheduler.decode_gate = spy
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.8, seed=5)
    seqs, step = {}, 0
    while len(seqs) < len(starts) or eng.has_unfinished():
        for i, start in enumerate(starts):
            if start == step:
                eng.add_request(f"r{i}", PROMPTS[i], params, keep_logits=True)
                seqs[f"r{i}"] = eng.requests[f"r{i}"]
        eng.step()
        step += 1
    return {r: (s.output_ids, s.logits) for r, s in seqs.items()}, widths


def same(a, b):
    return a.keys() == b.keys() and all(a[r][0] == b[r][0] and all(map(torch.equal, a[r][1], b[r][1])) for r in a)


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=2, max_size=4), st.sampled_from([4, 6, 10]), st.sampled_from([5.0, 40.0]))
def test_tokens_do_not_change_with_load_control(device, attention_backend, starts, cap, wait_ms):
    off, _ = run(engine(device, attention_backend, cap, "off"), starts)
    eng = engine(device, attention_backend, cap, "on", wait_ms)
    eng.load_control.controller.costs = DecodeStepCosts(copy_s=5e-3)  # so that it does hold requests back
    on, widths = run(eng, starts)
    assert same(off, on)


def test_it_holds_requests_back_when_their_working_sets_do_not_fit(device, attention_backend):
    eng = engine(device, attention_backend, cap=4, wait_ms=200.0)
    eng.load_control.controller.costs = DecodeStepCosts(copy_s=5e-3)  # a link as slow as a GPU's is against its HBM
    _, widths = run(eng, [0, 0, 0, 0], max_tokens=24)
    assert any(chosen < ready for ready, chosen in widths)  # 4 requests x top-4 cannot share 4 slots
    assert all(1 <= chosen <= ready for ready, chosen in widths)
    stats = eng.stats()["load_control"]
    assert stats["switches"] >= 2 and sum(stats["width_steps"].values()) == len(widths)


def test_the_feed_gives_each_request_its_own_decode_routing(device, attention_backend):
    eng = engine(device, attention_backend, cap=4, control="off")
    seen: dict[str, list[np.ndarray]] = {}
    eng.subscribe_routing(lambda rows, owners: [seen.setdefault(r, []).append(rows[i]) for i, (r, d) in enumerate(owners) if d])
    feed = eng.feed
    routed: list[list[np.ndarray]] = []  # per step, each MoE layer's [T, K] as a routing observer saw it

    class Observer:
        def begin_step(self):
            routed.append([])

        def record(self, layer, topk_ids, topk_weights):
            routed[-1].append(topk_ids.cpu().numpy())

    eng.runner.add_routing_observer(Observer())
    batches = []  # per step, (request, tokens, decodes) as scheduled
    schedule = eng.scheduler.schedule

    def spy():
        batch = schedule()
        if batch is not None:
            batches.append([(q.request_id, n, n == 1 and bool(q.output_ids)) for q, n in zip(batch.seqs, batch.num_tokens)])
        return batch

    eng.scheduler.schedule = spy
    run(eng, [0, 1, 3])
    feed.drain()
    expect: dict[str, list[np.ndarray]] = {}
    for batch, layers in zip(batches, routed, strict=True):
        rows, at = np.stack(layers, axis=1), 0  # [T, L, K]
        for rid, n, decode in batch:
            if decode:
                expect.setdefault(rid, []).append(rows[at])
            at += n
    assert expect.keys() == seen.keys() == {"r0", "r1", "r2"}
    for rid in expect:
        assert np.array_equal(np.stack(expect[rid]), np.stack(seen[rid]))
    assert feed.lost == 0


def test_no_load_control_where_it_cannot_matter(device, attention_backend):
    assert engine(device, attention_backend, cap=16).load_control is None  # C = N: every joint set fits
    assert engine(device, attention_backend, cap=4, control="off").load_control is None
    assert engine(device, attention_backend, cap=None, mode="resident").load_control is None


def test_hybrid_prices_a_miss_at_the_link_and_the_cpu_together(device, attention_backend):
    from wisp.core.learners.hybrid_costs import HybridCosts
    from wisp.engine.load_control.attach import miss_seconds

    costs = HybridCosts(copy_s=2e-3, cpu_rows=(1, 4), cpu_s_at_rows=(6e-3, 9e-3))
    eng = LLMEngine(EngineConfig(model="demo", device=device, attention_backend=attention_backend, mode="hybrid",
                                 expert_cap=4, max_model_len=96, max_concurrency=4, hybrid_costs=costs))
    store = next(iter(eng.model.experts.values()))
    assert eng.load_control is not None and store.cpu is not None
    assert abs(miss_seconds(store, eng.device) - 1 / (1 / 2e-3 + 1 / 6e-3)) < 1e-12
    assert eng.load_control.controller.costs.copy_s == miss_seconds(store, eng.device)


def test_a_plan_applied_while_serving_gives_the_controller_the_new_slots(device, attention_backend):
    eng = engine(device, attention_backend, cap=4)
    eng.apply_plan([6] * len(eng.model.experts), eng.pool.num_blocks)
    assert eng.load_control.controller.caps.tolist() == [6.0] * len(eng.load_control.layers)


def test_a_fixed_width_baseline_decodes_at_most_that_many_with_the_same_tokens(device, attention_backend):
    off, _ = run(engine(device, attention_backend, 16, "off"), [0, 0, 1, 2])
    eng = engine(device, attention_backend, 16, "width:2")  # C = N: only the width holds requests back
    on, widths = run(eng, [0, 0, 1, 2])
    assert same(off, on)
    assert max(chosen for _, chosen in widths) == 2 and any(ready > 2 for ready, _ in widths)
