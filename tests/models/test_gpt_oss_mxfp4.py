"""GPT-OSS with MXFP4 experts: a checkpoint we quantize ourselves (blocks + scales, as the hub's) matches
transformers' GPT-OSS on its dequantized weights, stays packed in every store, and gives in every mode the
bits of the bf16-layout checkpoint of those dequantized weights (the torch kernels dequantize exactly)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import assert_hybrid_computes_packed_experts_on_the_cpu, assert_quantized_gives_its_twins_bits, make_hf_model
from wisp import LLM, SamplingParams
from wisp.core.kernels.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from wisp.models.random_checkpoint import write_random_checkpoint

PROMPT = [5, 17, 99, 3, 64, 21, 8, 120, 45, 77, 12, 33]
MXFP4_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(the MXFP4 checkpoint, the plain checkpoint of its dequantized weights, HF's logits on the latter)."""
    root = tmp_path_factory.mktemp("gpt_oss")
    hf = make_hf_model("gpt_oss")
    twin = {}
    with torch.no_grad():  # every expert weight replaced by its MXFP4 round trip: the twin holds what MXFP4 holds
        for name, p in hf.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = quantize_mxfp4(p.transpose(1, 2))  # [E, out, in]: the hub's row layout
                twin[name] = (blocks, scales)
                p.copy_(dequantize_mxfp4(blocks, scales, p.dtype).transpose(1, 2))
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
    plain = root / "plain"
    hf.save_pretrained(plain)
    mxfp4 = root / "mxfp4"
    mxfp4.mkdir()
    tensors = load_file(plain / "model.safetensors")
    for name, (blocks, scales) in twin.items():
        del tensors[name]
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, str(mxfp4 / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((plain / "config.json").read_text())
    (mxfp4 / "config.json").write_text(json.dumps({**config, "quantization_config": MXFP4_CONFIG}))
    return mxfp4, plain, ref


def test_mxfp4_gpt_oss_matches_transformers_on_the_dequantized_weights(checkpoints, device, moe_backend,
                                                                        attention_backend):
    mxfp4, _, ref = checkpoints
    llm = LLM(str(mxfp4), device=device, moe_backend=moe_backend, attention_backend=attention_backend, mode="resident")
    assert (llm.prompt_logits(PROMPT).cpu() - ref).abs().max().item() < (1e-4 if device == "cpu" else 1e-3)
    bank = llm.engine.model.experts[0].residency.bank
    assert bank["gate_up"].dtype == torch.uint8 and bank["gate_up"].shape[-1] == 16  # packed, in the slots too


@pytest.mark.parametrize("mode, cap", [("resident", None), ("paged", 2), ("offload", None), ("zero-copy", None),
                                       ("hybrid", 2)])
def test_every_mode_of_mxfp4_gives_the_bits_of_its_dequantized_twin(checkpoints, mode, cap, device, moe_backend,
                                                                    attention_backend):
    if mode == "zero-copy" and device.startswith("cuda") and moe_backend == "torch":
        pytest.skip("zero-copy on CUDA reads experts in place with the Triton kernel only")
    mxfp4, plain, _ = checkpoints
    llm4, llmp = assert_quantized_gives_its_twins_bits(mxfp4, plain, mode, cap, device, moe_backend,
                                                       attention_backend, PROMPT)
    if mode == "paged":  # what crosses the link: 4.25 bits a weight plus the biases, against 32
        s4, sp = llm4.stats(), llmp.stats()
        assert s4["expert_loads"] == sp["expert_loads"] and s4["bytes_h2d"] * 5 < sp["bytes_h2d"]


def test_hybrids_native_cpu_kernel_computes_mxfp4_experts_packed(checkpoints):
    mxfp4, plain, _ = checkpoints
    assert_hybrid_computes_packed_experts_on_the_cpu(mxfp4, plain, PROMPT, tolerance=1e-3)


def test_random_mxfp4_gpt_oss_checkpoints_load_and_run(tmp_path):
    raw = json.loads((write_random_checkpoint(_tiny_gpt_oss(), tmp_path / "ckpt", seed=1) / "config.json").read_text())
    assert raw["quantization_config"]["quant_method"] == "mxfp4"
    index = json.loads((tmp_path / "ckpt" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.0.mlp.experts.gate_up_proj_blocks" in index and "model.layers.0.self_attn.sinks" in index
    out = LLM(str(tmp_path / "ckpt"), mode="paged", expert_cap=2).generate([PROMPT], SamplingParams(max_tokens=4))[0]
    assert len(out.token_ids) == 4


def _tiny_gpt_oss() -> dict:
    return {"architectures": ["GptOssForCausalLM"], "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
            "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 4, "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                "original_max_position_embeddings": 64, "truncate": False},
            "dtype": "float32", "quantization_config": MXFP4_CONFIG}
