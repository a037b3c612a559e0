"""A `wisp plan` file checked against the model vLLM serves, and read as the plug-in applies it (no vLLM needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.helpers import COMMON, FAMILY_SPECS
from tests.integrations.vllm.plans import tiny_plan
from wisp.integrations.vllm.plan_fit import fit_plan, kv_bytes_per_rank
from wisp.integrations.vllm.settings import WispVllmConfigError
from wisp.models.config_parsers import model_config
from wisp.plan.plan import Plan
from wisp.plan.sizes import ModelSizes


def served(family: str = "qwen3_moe", **overrides):
    """wisp's config of a tiny model as vLLM hands it over (a Hugging Face config's dict), in bfloat16."""
    import transformers

    cfg_cls, model_cls, kwargs = FAMILY_SPECS[family]
    raw = getattr(transformers, cfg_cls)(**{**COMMON, **kwargs, **overrides}, architectures=[model_cls]).to_dict()
    return replace(model_config(raw), dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def qwen3():
    return served()


@pytest.fixture(scope="module")
def plan(qwen3):
    return tiny_plan(qwen3, slots=5, caps=(2, 5))


def test_the_plans_caps_go_to_the_moe_layers_by_decoder_index(qwen3, plan):
    fit = fit_plan(plan, qwen3, "plan p.json")
    assert qwen3.moe_layer_ids == [0, 2] and fit.layer_caps == {0: 2, 2: 5}  # layer 1 is dense
    assert fit.kv_bytes == plan.report.kv_bytes == plan.kv_blocks * ModelSizes.of(qwen3, 16).block_bytes
    assert fit.kv_tokens == plan.kv_blocks * 16 and plan.kv_blocks == plan.report.admission_floor_blocks


def test_a_plan_made_with_the_embedding_on_the_host_fits_too(qwen3):
    assert fit_plan(tiny_plan(qwen3, slots=4, embedding_on_host=True), qwen3, "p").layer_caps == {0: 4, 2: 4}


@pytest.mark.parametrize("other, differs", [
    (lambda: served("olmoe"), "OlmoeForCausalLM"),
    (lambda: replace(served(), dtype=torch.float32), "24576-byte experts"),  # a plan for another dtype
    (lambda: served(hidden_size=128), "24576-byte experts"),
    (lambda: served(moe_intermediate_size=16), "6144-byte experts"),
    (lambda: served(num_experts=16), "bytes outside the experts"),
    (lambda: served(num_key_value_heads=4), "12288-byte KV blocks"),
    (lambda: served(mlp_only_layers=[]), "3 MoE layers"),
])
def test_a_plan_for_another_model_is_one_error_naming_both(plan, other, differs):
    with pytest.raises(WispVllmConfigError) as error:
        fit_plan(plan, other(), "plan p.json")
    message = str(error.value)
    assert message.startswith("plan p.json was made for another model: it records Qwen3MoeForCausalLM, 2 MoE "
                              "layers, 12288-byte experts, 6144-byte KV blocks of 16 tokens")
    assert "; vLLM serves " in message and differs in message.split("; vLLM serves ")[1]
    assert "wisp plan --model" in message and "\n" not in message


def test_a_hand_written_plan_is_checked_for_its_caps(qwen3):
    assert fit_plan(Plan((3, 8), 10), qwen3, "p").layer_caps == {0: 3, 2: 8}
    with pytest.raises(WispVllmConfigError, match="p has 3 per-layer caps; the model vLLM serves has 2 MoE layers"):
        fit_plan(Plan((4, 4, 4), 10), qwen3, "p")
    with pytest.raises(WispVllmConfigError, match="MoE layer 2 1 expert slots.*top_k 2 <= cap <= 8"):
        fit_plan(Plan((4, 1), 10), qwen3, "p")
    with pytest.raises(WispVllmConfigError, match="MoE layer 0 9 expert slots"):
        fit_plan(Plan((9, 4), 10), qwen3, "p")


@pytest.mark.parametrize("total, rank, share", [(2, 2, 1.0), (4, 2, 0.5), (4, 1, 0.25), (2, 1, 0.5)])
def test_each_tensor_parallel_rank_takes_its_heads_share_of_the_kv_bytes(total, rank, share):
    assert kv_bytes_per_rank(4096 * 28, total, rank) == 4096 * 28 * share
