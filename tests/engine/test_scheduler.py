"""Scheduler properties under a token budget (hypothesis), with the engine's bookkeeping simulated:

- a step's tokens stay within the budget, except that decodes are never held back;
- with a decode gate (load control), exactly the ready requests it chooses decode, after the step's prefill chunks;
- every running request whose prompt is prefilled gets its decode token in every step it is not
  preempted from, and a request's tokens in a step are its next uncomputed ones;
- a running request holds exactly the blocks its tokens need, and the pool's invariants hold;
- every request finishes, with as many outputs as it asked for, whatever the arrival order, the
  budget and the pool size (down to one request's worth: preemption by recompute).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from wisp.engine.block_pool import BlockPool
from wisp.engine.sampling import SamplingParams
from wisp.engine.scheduler import Scheduler
from wisp.engine.sequence import Sequence, Status

BLOCK = 4


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 6))
    prompts = [draw(st.lists(st.integers(0, 3), min_size=1, max_size=30)) for _ in range(n)]
    outputs = [draw(st.integers(1, 8)) for _ in range(n)]
    arrivals = sorted(draw(st.integers(0, 10)) for _ in range(n))
    max_running = draw(st.integers(1, 4))
    budget = draw(st.integers(max_running, 40))
    longest = max(len(p) + o for p, o in zip(prompts, outputs))
    need = -(-longest // BLOCK)
    blocks = draw(st.one_of(st.integers(need, need + 3), st.integers(need, 3 * need * max_running)))  # tight: preemption
    return prompts, outputs, arrivals, max_running, budget, blocks


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(case=workloads(), caching=st.booleans(), gate_seed=st.one_of(st.none(), st.integers(0, 2**16)))
def test_every_request_finishes_within_the_budget(case, caching, gate_seed):
    prompts, outputs, arrivals, max_running, budget, blocks = case
    pool = BlockPool(blocks, BLOCK)
    sched = Scheduler(pool, max_running, budget, prefix_caching=caching)
    chosen: list[Sequence] = []  # what the gate chose this step ...
    asked: list[Sequence] = []  # ... among these
    if gate_seed is not None:  # a gate that lets a random non-empty subset of the ready requests decode
        rng = random.Random(gate_seed)

        def gate(ready):
            assert ready and all(s.output_ids and len(s) - s.num_computed == 1 for s in ready)
            asked[:] = ready
            chosen[:] = [s for s in ready if rng.random() < 0.5] or [rng.choice(ready)]
            return list(chosen)
        sched.decode_gate = gate
    seqs = [Sequence(f"r{i}", p, SamplingParams(max_tokens=o, ignore_eos=True), max_len=64) for i, (p, o) in
            enumerate(zip(prompts, outputs))]
    step = 0
    while step < 2000 and (any(s.status is not Status.FINISHED for s in seqs)):
        for seq, at in zip(seqs, arrivals):
            if at == step:
                sched.add(seq)
        chosen.clear()
        asked.clear()
        batch = sched.schedule()
        step += 1
        if batch is None:
            continue
        decodes = [s for s in sched.running if len(s) - s.num_computed == 1]
        if gate_seed is None:
            assert all(s in batch.seqs for s in decodes)  # decodes are never held back
        else:
            kinds = [id(s) in set(map(id, asked)) for s in batch.seqs]  # the gate's ready requests: a decode token each
            assert {id(s) for s, k in zip(batch.seqs, kinds) if k} == set(map(id, chosen))  # exactly the chosen
            assert kinds == sorted(kinds)  # decode tokens last
            assert all(len(s.block_table) == -(-len(s) // BLOCK) for s in asked)  # held back: blocks kept
        assert sum(batch.num_tokens) <= max(budget, len(decodes))
        assert len(set(map(id, batch.seqs))) == len(batch.seqs)
        for seq, n in zip(batch.seqs, batch.num_tokens):
            assert seq.status is Status.RUNNING and 1 <= n <= len(seq) - seq.num_computed
            assert len(seq.block_table) == -(-len(seq) // BLOCK)
        for seq, n in zip(batch.seqs, batch.num_tokens):  # the engine: KV written, full blocks keyed, maybe a token
            seq.num_computed += n
            bs, ids = BLOCK, seq.token_ids
            for i in range(len(seq.block_keys), seq.num_computed // bs):
                parent = seq.block_keys[-1] if seq.block_keys else None
                seq.block_keys.append(pool.register(seq.block_table[i], parent, ids[i * bs : (i + 1) * bs]))
            if seq.num_computed == len(seq):
                seq.output_ids.append(7)
                if len(seq.output_ids) >= seq.params.max_tokens:
                    sched.finish(seq, "length")
        pool.check_integrity([s.block_table for s in sched.running])
    assert all(s.status is Status.FINISHED and len(s.output_ids) == s.params.max_tokens for s in seqs)
    event(f"preempted: {pool.counters.preemptions > 0}")
    event(f"a prompt was chunked: {any(len(p) > budget for p in prompts)}")
