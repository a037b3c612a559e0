"""Byte identity: paged (any cap), offload and zero-copy give logits torch.equal to resident.

Covers prefill (every prompt position) and 16 decode steps, float32 and bfloat16, and a prompt long
enough that a cap-2 scratch must run its prefill expert-major (a wide step).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import FAMILIES
from wisp import LLM, SamplingParams

LONG_PROMPT = [(7 * i + 3) % 128 for i in range(40)]
SHORT_PROMPT = [5, 17, 99]
VARIANTS = [("paged", 2), ("paged", 4), ("paged", 8), ("offload", None)]  # N=8, top_k=2: caps top_k, N/2, N


def run(path, mode, cap, dtype, prompt, device, moe_backend, attention_backend):
    llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode=mode, expert_cap=cap, dtype=dtype)
    prefill = llm.prompt_logits(prompt)
    out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True), return_logits=True)[0]
    return llm, prefill, out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_paged_offload_and_zero_copy_equal_resident(hf_checkpoints, family, dtype, device, moe_backend, attention_backend):
    path = hf_checkpoints[family]
    variants = VARIANTS + ([("zero-copy", None)] if device == "cpu" or moe_backend == "triton" else [])
    for prompt in (LONG_PROMPT, SHORT_PROMPT):
        _, ref_prefill, ref = run(path, "resident", None, dtype, prompt, device, moe_backend, attention_backend)
        assert len(ref.logits) == 16
        for mode, cap in variants:
            llm, prefill, out = run(path, mode, cap, dtype, prompt, device, moe_backend, attention_backend)
            assert torch.equal(prefill, ref_prefill), (mode, cap)
            assert out.token_ids == ref.token_ids, (mode, cap)
            for step, (a, b) in enumerate(zip(out.logits, ref.logits)):
                assert torch.equal(a, b), (mode, cap, step)
            if mode == "paged" and cap == 2 and prompt is LONG_PROMPT:
                stats = llm.stats()
                # one MoE step per forward (2 prefills + 15 decode steps per layer): no token groups
                assert stats["moe_steps"] == len(stats["per_layer"]) * (2 + 15)


def test_a_wide_prefill_loads_each_expert_once(hf_checkpoints, device, moe_backend, attention_backend):
    llm = LLM(str(hf_checkpoints["mixtral"]), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="paged", expert_cap=2)
    llm.prompt_logits(LONG_PROMPT)
    for counters in llm.stats()["per_layer"].values():
        assert counters["steps"] == 1
        assert 2 < counters["loads"] == counters["misses"] <= 8  # wider than the slots, each expert once
    for store in llm.model.experts.values():
        store.residency.pager.check_integrity()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_batch_does_not_change_a_requests_tokens(hf_checkpoints, family, device, moe_backend, attention_backend):
    """A request's logits are identical alone and inside a batch of other requests (batch invariance).
    qwen2_moe's shared expert (width 40) and [T, 1] sigmoid gate catch elementwise ops whose bits
    follow the row count (a SIMD tail) on AVX2 as well as AVX-512."""
    path = hf_checkpoints[family]
    llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="paged", expert_cap=4)
    prompts = [LONG_PROMPT, SHORT_PROMPT, [9, 9, 9, 1], list(range(30, 50))]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    batched = llm.generate(prompts, params, return_logits=True)
    for prompt, b in zip(prompts, batched):
        alone = llm.generate([prompt], params, return_logits=True)[0]
        assert alone.token_ids == b.token_ids
        assert all(torch.equal(x, y) for x, y in zip(alone.logits, b.logits))
