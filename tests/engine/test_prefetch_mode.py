"""`prefetch=True` end to end: logits torch.equal to resident, experts prefetched, and refused without slots."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_mode_identity import LONG_PROMPT, SHORT_PROMPT, run
from wisp import LLM, SamplingParams
from wisp.config import EngineConfig
from wisp.errors import WispError


def test_prefetch_changes_no_logit(device, moe_backend, attention_backend):
    path = "demo"  # 4 MoE layers of 16 experts, top-4: room for guesses to land
    for prompt in (LONG_PROMPT, SHORT_PROMPT):
        _, ref_prefill, ref = run(path, "resident", None, "float32", prompt, device, moe_backend, attention_backend)
        llm = LLM(str(path), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="paged",
                  expert_cap=4, dtype="float32", prefetch=True)
        assert torch.equal(llm.prompt_logits(prompt), ref_prefill)
        out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True), return_logits=True)[0]
        assert out.token_ids == ref.token_ids and all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits))
        stats = llm.stats()
        assert stats["expert_prefetched"] > 0 and stats["graph_steps"] == 0
        for store in llm.engine.model.experts.values():
            store.residency.pager.check_integrity()


@pytest.mark.parametrize("mode", ["resident", "hybrid", "offload"])
def test_prefetch_needs_paged_mode(mode):
    with pytest.raises(WispError, match="--prefetch"):
        EngineConfig(model="demo", mode=mode, prefetch=True)
