"""q, k and v projected by one fused weight (`AttentionWeights.fuse_qkv`, done on CUDA with the Triton GEMM) and
readied by one launch (`triton_qkv_heads`) compute what the three projections and the separate norm and rotation
kernels compute, for every family; the fused weight holds the same bytes, with q, k and v left as its views."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import FAMILIES
from wisp import LLM
from wisp.models.moe_decoder import AttentionWeights

PROMPT = [5, 17, 99, 3, 64, 21, 8, 120, 45, 77, 12, 33]


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_qkv_gives_the_logits_of_three_projections(hf_checkpoints, family, device, moe_backend):
    llm = LLM(str(hf_checkpoints[family]), device=device, moe_backend=moe_backend, mode="resident")
    model = llm.engine.model
    attns = [lw.attn for lw in model.layers if isinstance(lw.attn, AttentionWeights)]
    if not attns:
        pytest.skip(f"{family} has no q/k/v projections (latent attention)")
    for w in attns:  # back to three weights where the loader fused them (CUDA)
        if w.qkv is not None:
            w.q, w.k, w.v = (t.clone() for t in (w.q, w.k, w.v))
            w.qkv = w.qkv_bias = None
    apart = llm.prompt_logits(PROMPT).cpu()
    for w in attns:
        q, k, v = w.q.clone(), w.k.clone(), w.v.clone()
        w.fuse_qkv()
        assert w.qkv is not None and torch.equal(w.qkv, torch.cat([q, k, v]))
        assert w.q.data_ptr() == w.qkv.data_ptr() and torch.equal(w.v, v)  # views of the fused weight
    fused = llm.prompt_logits(PROMPT).cpu()
    assert (fused - apart).abs().max().item() < 1e-4
