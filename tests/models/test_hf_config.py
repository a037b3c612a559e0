"""wisp.models.hf_config: every family's quirks in a Hugging Face config.json resolved into one set of fields."""

from __future__ import annotations

import json

import pytest
import torch

from wisp.errors import WispError
from wisp.models.config_parsers import model_config, read_model_config
from wisp.models.demo import DEMO_CONFIG
from wisp.models.hf_config import parse_hf_config


def test_each_family_config_normalises(hf_checkpoints):
    cfgs = {f: read_model_config(p) for f, p in hf_checkpoints.items()}
    assert cfgs["qwen3_moe"].moe_layers == (True, False, True)  # mlp_only_layers=[1]
    assert cfgs["qwen3_moe"].qk_norm == "per_head" and cfgs["qwen3_moe"].head_dim == 16
    assert cfgs["qwen2_moe"].moe_layers == (False, True, False, True)  # decoder_sparse_step=2
    assert cfgs["qwen2_moe"].shared_expert_intermediate_size == 40 and cfgs["qwen2_moe"].attention_bias
    assert cfgs["olmoe"].qk_norm == "full" and not cfgs["olmoe"].norm_topk_prob
    assert cfgs["mixtral"].norm_topk_prob  # Mixtral always renormalises its top-k
    for cfg in cfgs.values():
        assert cfg.num_experts == 8 and cfg.top_k == 2 and cfg.dtype == torch.float32


def test_legacy_rope_fields_and_num_local_experts():
    raw = dict(DEMO_CONFIG, rope_theta=5e5)
    raw.pop("num_experts")
    raw["num_local_experts"] = 16
    raw["rope_scaling"] = {"type": "linear", "factor": 2.0}
    cfg = model_config(raw)
    assert cfg.num_experts == 16 and cfg.rope.theta == 5e5 and cfg.rope.factor == 2.0 and cfg.rope.kind == "linear"


def test_unsupported_rope_type_is_a_clear_error():
    with pytest.raises(WispError, match="rope_type"):
        model_config(dict(DEMO_CONFIG, rope_parameters={"rope_type": "dynamic", "factor": 4.0}))


def test_eos_ids_come_from_config_and_generation_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(DEMO_CONFIG, eos_token_id=[256, 257])))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 258}))
    assert read_model_config(tmp_path).eos_token_ids == (256, 257, 258)


def _gpt_oss(**changes):
    from wisp.models.presets import preset

    return {**preset("gpt-oss-20b"), **changes}


def test_config_edges_of_the_new_families_are_read_as_transformers_reads_them_or_refused():
    from wisp.models.presets import preset

    lite = preset("deepseek-v2-lite")
    no_factor = dict(lite, rope_scaling={k: v for k, v in lite["rope_scaling"].items() if k != "factor"})
    base, derived = model_config(lite), model_config(no_factor)  # factor = max_pos / original = 40
    assert derived.rope == base.rope and derived.mla.softmax_scale == base.mla.softmax_scale > 192**-0.5
    top_level = dict(_gpt_oss(), original_max_position_embeddings=4096)
    top_level["rope_parameters"] = {k: v for k, v in top_level["rope_parameters"].items()
                                    if k != "original_max_position_embeddings"}
    assert model_config(top_level).rope == model_config(_gpt_oss()).rope
    assert model_config({k: v for k, v in _gpt_oss().items() if k != "sliding_window"}).window_of(0) == 128
    with pytest.raises(WispError, match="layer_types names 3 layers but num_hidden_layers is 24"):
        model_config(_gpt_oss(layer_types=["sliding_attention"] * 3))
    mixtral_mxfp4 = dict(preset("mixtral-8x7b"), quantization_config={"quant_method": "mxfp4"})
    with pytest.raises(WispError, match="MXFP4 experts are supported for GPT-OSS checkpoints only"):
        model_config(mixtral_mxfp4)


@pytest.mark.parametrize("generation, expected", [
    ({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20},
     (("temperature", 0.6), ("top_p", 0.95), ("top_k", 20.0))),
    ({"temperature": 0.7}, (("temperature", 0.7),)),
    ({"do_sample": False, "temperature": 0.6}, ()),  # transformers would decode greedily
    ({"top_k": -1, "top_p": 1}, (("top_p", 1.0), ("top_k", 0.0))),  # -1: no top-k, as vLLM reads it
    ({"temperature": float("nan"), "top_p": "0.9", "top_k": True}, ()),  # not finite numbers: ignored
    ({"eos_token_id": 2}, ()),
])
def test_generation_config_sampling_defaults(generation, expected):
    assert parse_hf_config(DEMO_CONFIG, generation).sampling_defaults == expected
