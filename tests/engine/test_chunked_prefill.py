"""Chunked prefill: a per-step token budget (--max-num-batched-tokens).

- every step stays within the budget, except that decodes are never held back;
- a request that is decoding gets a token every step while another's long prompt is prefilled;
- nothing is sampled before a prompt's last chunk, and its blocks are all taken at admission;
- a request's logits are torch.equal whatever the budget, whether its prefill shared steps with other
  requests' decodes, and in paged mode at a cap small enough that every chunk is a wide step.
"""

from __future__ import annotations

import pytest
import torch

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
LONG = [(11 * i + 5) % 200 for i in range(53)]
SHORT = [3, 1, 4, 1, 5]


def engine(device, attention_backend, budget, mode="paged", cap=4):
    return LLMEngine(EngineConfig(model="demo", device=device, attention_backend=attention_backend, mode=mode,
                                  expert_cap=cap if mode == "paged" else None, max_model_len=128, max_concurrency=3,
                                  max_num_batched_tokens=budget))


def run(eng, prompts, start_steps=()):
    """Add prompts (the i-th after start_steps[i] engine steps), run to the end; per request its logits,
    and per step the scheduled (request, tokens) list."""
    seqs, batches, step = {}, [], 0
    schedule = eng.scheduler.schedule

    def spy():
        batch = schedule()
        if batch is not None:
            batches.append([(s.request_id, n, len(s) - s.num_computed) for s, n in zip(batch.seqs, batch.num_tokens)])
        return batch

    eng.scheduler.schedule = spy
    starts = list(start_steps) or [0] * len(prompts)
    while len(seqs) < len(prompts) or eng.has_unfinished():
        for i, prompt in enumerate(prompts):
            if starts[i] == step and f"r{i}" not in seqs:
                eng.add_request(f"r{i}", prompt, PARAMS, keep_logits=True)
                seqs[f"r{i}"] = eng.requests[f"r{i}"]
        eng.step()
        step += 1
    return {rid: s.logits for rid, s in seqs.items()}, batches


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["paged", "resident"])
def test_logits_do_not_depend_on_the_budget_or_on_sharing_steps(device, attention_backend, mode):
    ref, _ = run(engine(device, attention_backend, 4096, mode), [LONG])
    ref_short, _ = run(engine(device, attention_backend, 4096, mode), [SHORT])
    for budget in (3, 7, 16, 50):
        got, batches = run(engine(device, attention_backend, budget, mode), [SHORT, LONG], start_steps=[0, 2])
        assert all(torch.equal(a, b) for a, b in zip(got["r1"], ref["r0"])), budget
        assert all(torch.equal(a, b) for a, b in zip(got["r0"], ref_short["r0"])), budget
        for batch in batches:
            decodes = sum(1 for _, n, pending in batch if n == 1 and pending == 1)
            assert sum(n for _, n, _ in batch) <= max(budget, decodes)
        # the long prompt's chunks (short of its end) ran beside the short request's decodes
        assert any(("r0", 1, 1) in b and any(r == "r1" and n < pending for r, n, pending in b) for b in batches)


def test_a_prompt_is_sampled_only_after_its_last_chunk(device, attention_backend):
    eng = engine(device, attention_backend, 10)
    eng.add_request("r", LONG, PARAMS)
    seq = eng.requests["r"]
    assert len(eng.step()) == 0  # admission: every block of the prompt, 10 tokens computed
    assert seq.num_computed == 10 and len(seq.block_table) == -(-len(LONG) // 16) and not seq.output_ids
    steps = 1
    while not seq.output_ids:
        outs = eng.step()
        steps += 1
    assert steps == -(-len(LONG) // 10) and [o.request_id for o in outs] == ["r"]
    assert eng.stats()["tokens_prefilled"] == len(LONG)


def test_the_budget_is_validated():
    with pytest.raises(WispError, match="max-num-batched-tokens"):
        EngineConfig(model="demo", max_num_batched_tokens=0)
    with pytest.raises(WispError, match="max-num-batched-tokens 3 .* --max-concurrency 4"):
        EngineConfig(model="demo", max_num_batched_tokens=3, max_concurrency=4)
