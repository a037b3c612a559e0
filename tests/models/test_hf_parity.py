"""Our decoder against transformers' reference implementation, for every supported family; DeepSeek-V2 also on
the Triton latent attention kernels, interpreted on the CPU (on CUDA: --wisp-attention-backend triton)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import FAMILIES, make_hf_model
from wisp import LLM, SamplingParams
from wisp.config import EngineConfig

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


@pytest.fixture
def interpreted_triton_attention(device, monkeypatch):
    """The engine's attention on the Triton kernels under Triton's interpreter: the engine asks for them on CUDA
    only, where the tests above run them compiled with --wisp-attention-backend triton."""
    if device != "cpu":
        pytest.skip("on CUDA the tests above run the compiled kernels (--wisp-attention-backend triton)")
    real = EngineConfig.resolve_backend
    monkeypatch.setattr(EngineConfig, "resolve_backend",
                        lambda self, kind, dev: "triton" if kind == "attention" else real(self, kind, dev))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["resident", "paged"])
def test_deepseek_on_the_triton_latent_attention_matches_transformers(hf_checkpoints, interpreted_triton_attention,
                                                                      mode):
    """Prompt logits within 1e-4 and 16 greedy tokens (prefill, then decode steps) with every layer's latent
    attention on `wisp.engine.triton_mla_attention` (its 24-wide entry: a latent of 16 and a rope key of 8)."""
    hf = make_hf_model("deepseek_v2")
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
        greedy = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False)[0, len(PROMPT):].tolist()
    llm = LLM(str(hf_checkpoints["deepseek_v2"]), device="cpu", mode=mode, expert_cap=2 if mode == "paged" else None)
    assert llm.engine.kv.uses_triton and llm.engine.kv.value_dim == 16
    assert (llm.prompt_logits(PROMPT) - ref).abs().max().item() < 1e-4
    assert llm.generate([PROMPT], SamplingParams(max_tokens=16))[0].token_ids == greedy
