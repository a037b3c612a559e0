"""Our decoder against transformers' reference implementation, for every supported family."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import FAMILIES, make_hf_model
from wisp import LLM, SamplingParams

PROMPT = [5, 17, 99, 3, 64, 21, 8, 120, 45, 77, 12, 33]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(hf_checkpoints, family, device, moe_backend, attention_backend):
    hf = make_hf_model(family)
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
    llm = LLM(str(hf_checkpoints[family]), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="resident")
    ours = llm.prompt_logits(PROMPT).cpu()
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["resident", "paged"])
def test_greedy_tokens_match_transformers_generate(hf_checkpoints, family, mode, device, moe_backend, attention_backend):
    hf = make_hf_model(family)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False)[0, len(PROMPT):].tolist()
    llm = LLM(str(hf_checkpoints[family]), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode=mode, expert_cap=2 if mode == "paged" else None)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=16))[0]
    assert out.token_ids == ref
    assert len(set(ref)) > 1  # a model stuck on one token would make this comparison weak
