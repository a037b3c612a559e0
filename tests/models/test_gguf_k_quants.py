"""A GGUF file's k-quant experts (Q4_K, Q5_K, Q6_K, beside Q8_0) kept packed, each layer and role in the file's own type:
random blocks of each type, and a real Q4_K_M file llama-quantize made (tests/models/data/qwen3_moe_q4_k_m.gguf), give
the tokens and logits of the safetensors twin holding the `gguf` package's dequantization of the file's tensors, in
every mode on the torch path; the planner's bytes are the file's; dummy weights take the file's layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import assert_quantized_gives_its_twins_bits
from tests.models.test_gguf import ARCH, EXPERT, K_QUANTS, PROMPT, bf16_twin, hf_checkpoint, hf_tensors, write_gguf
from wisp.core.kernels.quantized_weights import dequantize_weight

gguf = pytest.importorskip("gguf")


@pytest.mark.slow
@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quant_experts_give_the_twin_of_the_gguf_packages_floats(qtype, tmp_path):
    """Experts in a k-quant (random blocks: the gguf package writes none) against the safetensors twin holding the
    gguf package's own dequantization of the file's blocks (read back by name: experts.E.gate_proj is
    ffn_gate_exps[E])."""
    kind = gguf.GGMLQuantizationType[qtype]
    folder = hf_checkpoint("qwen3_moe", tmp_path / "hf", wide=256)  # k-quant rows: whole 256-value blocks
    file = write_gguf("qwen3_moe", folder, tmp_path / "q.gguf", gguf.GGMLQuantizationType.BF16, expert_qtype=kind)[0]
    stored = {t.name: t for t in gguf.GGUFReader(file).tensors}
    twin = bf16_twin(folder, tmp_path / "twin", lambda name, t: file_tensor(stored, None, name) if EXPERT.match(name)
                     else t)
    q, _ = assert_quantized_gives_its_twins_bits(file, twin, "paged", 2, "cpu", "torch", "torch", PROMPT)
    assert_experts_kept_as_the_file_stores_them(q.config, stored)


def file_tensor(stored: dict, names, name: str) -> torch.Tensor | None:
    """The Hugging Face tensor `name` as a GGUF file (`stored`: its tensors by name; `names`: the gguf package's
    `TensorNameMap`) holds it, dequantized by the gguf package (float32); experts.E.gate_proj is ffn_gate_exps[E]."""
    m = EXPERT.match(name)
    if m is not None:
        layer, e, part = int(m[1].split(".")[2]), int(m[2]), m[3].removesuffix("_proj")
        block = stored[f"blk.{layer}.ffn_{part}_exps.weight"]
        return torch.from_numpy(gguf.quants.dequantize(block.data, block.tensor_type)[e].copy())
    base = name.removesuffix(".weight")
    t = stored.get(names.get_name(base) + ".weight") if names.get_name(base) else None
    return None if t is None else torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["paged", "hybrid", "zero-copy"])
def test_a_q4_k_m_file_from_llama_quantize_gives_its_dequantized_twins_tokens(mode, tmp_path, caplog):
    """tests/models/data/qwen3_moe_q4_k_m.gguf (made by llama.cpp's llama-quantize: tests/models/make_q4_k_m_fixture.py)
    against the safetensors twin holding the gguf package's dequantization of each of its tensors."""
    from tests.models.make_q4_k_m_fixture import FIXTURE, SHAPE

    stored = {t.name: t for t in gguf.GGUFReader(FIXTURE).tensors}
    assert {"Q4_K", "Q6_K"} <= {t.tensor_type.name for t in stored.values()}  # llama-quantize's Q4_K_M mix
    twin = q4_k_m_twin(tmp_path)
    q, _ = assert_quantized_gives_its_twins_bits(FIXTURE, twin, mode, 2, "cpu", "torch", "torch", PROMPT)
    assert q.config.num_layers == SHAPE["num_hidden_layers"] and q.config.num_experts == SHAPE["num_experts"]
    assert "dequantized" not in caplog.text  # the experts stayed packed (the dense weights are dequantized silently)
    assert_experts_kept_as_the_file_stores_them(q.config, stored)
    assert q.config.expert_block_formats == (("Q4_K", "Q4_K"), ("Q4_K", "Q6_K"))  # llama-quantize's more bits for down


def q4_k_m_twin(tmp_path: Path) -> Path:
    """The safetensors twin of tests/models/data/qwen3_moe_q4_k_m.gguf: its config and names, every tensor the
    gguf package's dequantization of the file's."""
    from tests.models.make_q4_k_m_fixture import FIXTURE, SHAPE

    stored = {t.name: t for t in gguf.GGUFReader(FIXTURE).tensors}
    folder = hf_checkpoint("qwen3_moe", tmp_path / "hf", **SHAPE)  # its config and names; every weight comes from the file
    names = gguf.TensorNameMap(ARCH["qwen3_moe"], SHAPE["num_hidden_layers"])
    replaced = []

    def from_file(name: str, t: torch.Tensor) -> torch.Tensor:
        got = file_tensor(stored, names, name)
        assert got is not None and got.numel() == t.numel(), name
        replaced.append(name)
        return got.reshape(t.shape)

    twin = bf16_twin(folder, tmp_path / "twin", from_file)
    assert len(replaced) == len(hf_tensors(folder))
    return twin


def assert_experts_kept_as_the_file_stores_them(cfg, stored: dict) -> None:
    """The experts stayed in the file's block formats, layer by layer and role by role, and the planner's bytes are the
    file's: each layer's expert bytes, and a slot in every layer."""
    assert cfg.expert_format == "gguf_blocks"
    per_layer = []
    for li in cfg.moe_layer_ids:
        gate, up, down = (stored[f"blk.{li}.ffn_{r}_exps.weight"] for r in ("gate", "up", "down"))
        assert cfg.expert_block_formats[li] == (gate.tensor_type.name, down.tensor_type.name)
        per_layer.append(sum(int(t.n_bytes) for t in (gate, up, down)))
        assert cfg.expert_bytes_of(li) * cfg.num_experts == per_layer[-1]
    assert cfg.slot_bytes * cfg.num_experts == sum(per_layer) and cfg.expert_bytes * cfg.num_experts == max(per_layer)
    from wisp.plan.sizes import ModelSizes

    assert ModelSizes.of(cfg, 16).slot_bytes * cfg.num_experts == sum(per_layer)  # what `wisp plan` divides the VRAM by


def test_k_quant_experts_load_as_random_blocks_under_the_dummy_format():
    from wisp import LLM, SamplingParams
    from tests.models.make_q4_k_m_fixture import FIXTURE

    llm = LLM(str(FIXTURE), mode="resident", load_format="dummy")
    banks = [store.residency.bank_and_map()[0] for store in llm.model.experts.values()]
    assert [(b["down"].shape[-1], b["down_scale"].shape[-1]) for b in banks] == [(128, 16), (192, 18)]  # Q4_K, Q6_K
    for bank in banks:  # the file's layout per layer, random codes, finite scales
        values = dequantize_weight(bank["down"][0], bank["down_scale"][0], torch.float32)
        assert torch.isfinite(values).all() and 0 < values.std() < 1
    out = llm.generate(PROMPT, SamplingParams(max_tokens=3, temperature=0))[0]
    assert len(out.token_ids) == 3
