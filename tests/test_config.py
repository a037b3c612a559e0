"""ModelConfig.from_hf: every family's quirks resolved into one set of fields."""

from __future__ import annotations

import json

import pytest
import torch

from wisp.config import EngineConfig, ModelConfig
from wisp.errors import WispError
from wisp.models.random_checkpoint import DEMO_CONFIG


def test_each_family_config_normalises(hf_checkpoints):
    cfgs = {f: ModelConfig.from_dir(p) for f, p in hf_checkpoints.items()}
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
    cfg = ModelConfig.from_hf(raw)
    assert cfg.num_experts == 16 and cfg.rope.theta == 5e5 and cfg.rope.factor == 2.0 and cfg.rope.kind == "linear"


def test_unsupported_rope_type_is_a_clear_error():
    with pytest.raises(WispError, match="rope_type"):
        ModelConfig.from_hf(dict(DEMO_CONFIG, rope_parameters={"rope_type": "dynamic", "factor": 4.0}))


def test_expert_bytes_and_default_caps():
    cfg = ModelConfig.from_hf(DEMO_CONFIG)
    assert cfg.expert_bytes == 3 * 128 * 64 * 4
    assert EngineConfig(model="demo", mode="paged").resolve_cap(cfg) == 8
    assert EngineConfig(model="demo", mode="resident").resolve_cap(cfg) == 16
    with pytest.raises(WispError, match="between top_k=4 and num_experts=16"):
        EngineConfig(model="demo", expert_cap=3).resolve_cap(cfg)
    assert EngineConfig(model="demo", mode="hybrid", expert_cap=0).resolve_cap(cfg) == 0  # no slots: read in place
    with pytest.raises(WispError, match=r"expert cap 0 is out of range: it must be between top_k=4 and num_experts=16$"):
        EngineConfig(model="demo", mode="paged", expert_cap=0).resolve_cap(cfg)
    with pytest.raises(WispError, match=r"num_experts=16 \(or --mode hybrid-zero-copy, with no slots\)"):
        EngineConfig(model="demo", mode="hybrid", expert_cap=2).resolve_cap(cfg)


def test_bad_engine_options():
    with pytest.raises(WispError, match="unknown mode"):
        EngineConfig(model="demo", mode="swap")
    with pytest.raises(WispError, match="dtype"):
        EngineConfig(model="demo", dtype="int3")


def test_eos_ids_come_from_config_and_generation_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(DEMO_CONFIG, eos_token_id=[256, 257])))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 258}))
    assert ModelConfig.from_dir(tmp_path).eos_token_ids == (256, 257, 258)


def test_backends_resolve_per_device_and_refuse_what_cannot_run():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cfg = EngineConfig(model="demo")
    assert cfg.resolve_backend("moe", cpu) == "torch" and cfg.resolve_backend("attention", cuda) == "triton"
    with pytest.raises(WispError, match="needs a CUDA device"):
        EngineConfig(model="demo", moe_backend="triton").resolve_backend("moe", cpu)
    with pytest.raises(WispError, match="zero-copy"):
        EngineConfig(model="demo", mode="zero-copy", moe_backend="torch").resolve_backend("moe", cuda)
    assert EngineConfig(model="demo", mode="zero-copy").resolve_backend("moe", cpu) == "torch"
    with pytest.raises(WispError, match="pinned"):
        EngineConfig(model="demo", mode="zero-copy", pin_memory=False).resolve_backend("moe", cuda)
    with pytest.raises(WispError, match="--mode hybrid-zero-copy reads experts from host memory in place"):
        EngineConfig(model="demo", mode="hybrid", expert_cap=0, moe_backend="torch").resolve_backend("moe", cuda)
    assert EngineConfig(model="demo", mode="hybrid", expert_cap=2, moe_backend="torch").resolve_backend("moe", cuda) == "torch"
    with pytest.raises(WispError, match="cuda-graph-max-batch"):
        EngineConfig(model="demo", cuda_graph_max_batch=-1)


def _gpt_oss(**changes):
    from wisp.models.presets import preset

    return {**preset("gpt-oss-20b"), **changes}


def test_config_edges_of_the_new_families_are_read_as_transformers_reads_them_or_refused():
    from wisp.models.presets import preset

    lite = preset("deepseek-v2-lite")
    no_factor = dict(lite, rope_scaling={k: v for k, v in lite["rope_scaling"].items() if k != "factor"})
    base, derived = ModelConfig.from_hf(lite), ModelConfig.from_hf(no_factor)  # factor = max_pos / original = 40
    assert derived.rope == base.rope and derived.mla.softmax_scale == base.mla.softmax_scale > 192**-0.5
    top_level = dict(_gpt_oss(), original_max_position_embeddings=4096)
    top_level["rope_parameters"] = {k: v for k, v in top_level["rope_parameters"].items()
                                    if k != "original_max_position_embeddings"}
    assert ModelConfig.from_hf(top_level).rope == ModelConfig.from_hf(_gpt_oss()).rope
    assert ModelConfig.from_hf({k: v for k, v in _gpt_oss().items() if k != "sliding_window"}).window_of(0) == 128
    with pytest.raises(WispError, match="layer_types names 3 layers but num_hidden_layers is 24"):
        ModelConfig.from_hf(_gpt_oss(layer_types=["sliding_attention"] * 3))
    mixtral_mxfp4 = dict(preset("mixtral-8x7b"), quantization_config={"quant_method": "mxfp4"})
    with pytest.raises(WispError, match="MXFP4 experts are supported for GPT-OSS checkpoints only"):
        ModelConfig.from_hf(mixtral_mxfp4)


def test_hybrid_zero_copy_has_a_name_and_the_old_spelling_still_works(caplog):
    with caplog.at_level("WARNING", logger="wisp"):
        old = EngineConfig(model="demo", mode="hybrid", expert_cap=0)
    assert (old.mode, old.expert_cap) == ("hybrid-zero-copy", 0) and "deprecated" in caplog.text
    new = EngineConfig(model="demo", mode="hybrid-zero-copy", hot_experts=2)
    assert (new.mode, new.expert_cap, new.reads_in_place) == ("hybrid-zero-copy", 0, True)
    with pytest.raises(WispError, match="keeps no expert slots"):
        EngineConfig(model="demo", mode="hybrid-zero-copy", expert_cap=4)
    with pytest.raises(WispError, match="needs --mode hybrid-zero-copy"):
        EngineConfig(model="demo", mode="hybrid", expert_cap=2, hot_experts=1)
