"""An FP8 block-scaled checkpoint (Qwen3-*-FP8 layout: float8_e4m3fn projections with 128 x 128
weight_scale_inv) runs in every mode with the same bits as the plain checkpoint of its dequantized weights,
its experts paged as FP8 (half the bytes of bf16) with their scales; dummy weights and the planner's
sizes follow the same layout."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import assert_hybrid_computes_packed_experts_on_the_cpu, assert_quantized_gives_its_twins_bits
from wisp import LLM
from wisp.core.kernels.fp8_blocks import FP8, dequantize_blocks
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset
from wisp.plan.sizes import ModelSizes
from wisp.models.random_checkpoint import RandomWeights, write_random_checkpoint

FP8_QWEN3 = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 300, "hidden_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 256, "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "eos_token_id": 299,
    "dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
PROMPT = [5, 17, 99, 3, 250, 42, 7, 8, 9, 10, 11, 12]


@pytest.fixture(scope="module")
def fp8_and_plain(tmp_path_factory):
    """(an FP8 checkpoint, the bf16 checkpoint of its dequantized weights)."""
    root = tmp_path_factory.mktemp("fp8")
    fp8 = write_random_checkpoint(FP8_QWEN3, root / "fp8", seed=3)
    plain = root / "plain"
    plain.mkdir()
    for shard in fp8.glob("*.safetensors"):
        tensors = load_file(shard)
        out = {k: (dequantize_blocks(t, tensors[k + "_scale_inv"]) if t.dtype == FP8 else t)
               for k, t in tensors.items() if not k.endswith("_scale_inv")}
        save_file(out, str(plain / shard.name), metadata={"format": "pt"})
    index = json.loads((fp8 / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.endswith("_scale_inv")}
    (plain / "model.safetensors.index.json").write_text(json.dumps(index))
    raw = {k: v for k, v in FP8_QWEN3.items() if k != "quantization_config"}
    (plain / "config.json").write_text(json.dumps(raw))
    return fp8, plain


@pytest.mark.parametrize("mode, cap", [("resident", None), ("paged", 2), ("paged", 5), ("offload", None),
                                       ("zero-copy", None), ("hybrid", 2)])
def test_fp8_runs_with_the_bits_of_its_dequantized_checkpoint(fp8_and_plain, mode, cap, device, moe_backend,
                                                               attention_backend):
    if mode == "zero-copy" and device.startswith("cuda") and moe_backend != "triton":
        pytest.skip("zero-copy on CUDA reads experts in place with the Triton kernel only")
    fp8, plain = fp8_and_plain
    llm8, llmp = assert_quantized_gives_its_twins_bits(fp8, plain, mode, cap, device, moe_backend, attention_backend,
                                                       PROMPT)
    store = next(iter(llm8.engine.model.experts.values()))
    bank = getattr(store, "host", None) or getattr(store, "bank", None) or store.residency.pager.host
    assert bank["gate_up"].dtype == FP8 and "gate_up_scale" in bank  # paged as FP8, scales beside
    if mode == "paged":
        s8, sp = llm8.stats(), llmp.stats()
        assert s8["bytes_h2d"] * 2 < sp["bytes_h2d"] * 1.01 and s8["expert_loads"] == sp["expert_loads"]


def test_hybrids_native_cpu_kernel_computes_fp8_experts_packed(fp8_and_plain):
    assert_hybrid_computes_packed_experts_on_the_cpu(*fp8_and_plain, PROMPT, tolerance=3e-2)  # bf16 logits


def test_dummy_fp8_weights_and_sizes_follow_the_fp8_layout():
    cfg = model_config(FP8_QWEN3)
    reader = RandomWeights(cfg)
    key = "model.layers.0.mlp.experts.3.up_proj.weight"
    assert reader.get(key).dtype == FP8 and reader.get(key.replace(".weight", ".weight_scale_inv")).shape == (1, 2)
    assert reader.get("model.layers.0.mlp.gate.weight").dtype == torch.bfloat16  # the router stays plain
    fp8, bf16 = (model_config(preset(name)) for name in ("qwen3-30b-a3b-fp8", "qwen3-30b-a3b"))
    assert fp8.expert_bytes == 3 * 2048 * 768 + 4 * (12 * 16 + 16 * 6)  # FP8 bytes + float32 block scales
    assert bf16.expert_bytes == 2 * 3 * 2048 * 768
    fp8_sizes, bf16_sizes = ModelSizes.of(fp8, 16), ModelSizes.of(bf16, 16)  # what `wisp plan` divides the budget by
    assert fp8_sizes.slot_bytes == 48 * fp8.expert_bytes and fp8_sizes.non_expert_bytes < bf16_sizes.non_expert_bytes


@pytest.mark.parametrize("width, message", [(96, "multiple of the 128-row block"),
                                             (128, "the config says fp8 but model.layers.0.mlp.experts.0.gate_proj.weight is bfloat16")])
def test_fp8_configs_the_loader_cannot_honour_are_one_error(tmp_path, width, message):
    raw = {**FP8_QWEN3, "moe_intermediate_size": width}
    path = write_random_checkpoint({**raw, "quantization_config": None}, tmp_path / "p")  # plain tensors
    (path / "config.json").write_text(json.dumps(raw))  # ... under an fp8 config

    with pytest.raises(WispError, match=message):
        LLM(str(path), device="cpu", mode="paged", expert_cap=2)
