"""Loader placement by mode, pinned masters on CUDA, and the fused-experts checkpoint layout."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from wisp import LLM
from wisp.models.config_parsers import read_model_config

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def test_expert_placement_by_mode(hf_checkpoints, device):
    path = hf_checkpoints["qwen3_moe"]
    cfg = read_model_config(path)
    dev = torch.device(device).type
    paged = LLM(str(path), device=device, mode="paged", expert_cap=3)
    for store in paged.model.experts.values():
        assert store.mode == "paged" and store.slots == 3
        for name, master in store.residency.pager.host.items():
            assert master.device.type == "cpu" and master.shape[0] == cfg.num_experts
            assert master.is_pinned() == (dev == "cuda")
            assert store.residency.pager.scratch[name].device.type == dev and store.residency.pager.scratch[name].shape[0] == 3
        assert store.device_bytes == 3 * cfg.expert_bytes
    resident = LLM(str(path), device=device, mode="resident")
    for store in resident.model.experts.values():
        assert store.mode == "resident" and store.slots is None
        assert all(t.device.type == dev for t in store.residency.bank.values())
        assert store.device_bytes == cfg.num_experts * cfg.expert_bytes
    offload = LLM(str(path), device=device, mode="offload")
    stores = list(offload.model.experts.values())
    assert all(s.mode == "offload" and s.slots is None for s in stores)
    assert len({id(s.residency.buffer) for s in stores}) == 1  # one layer-sized buffer for the whole model
    assert sum(s.device_bytes for s in stores) == cfg.num_experts * cfg.expert_bytes


def test_fused_expert_tensors_load_the_same(hf_checkpoints, tmp_path, device):
    """A checkpoint storing experts stacked (experts.gate_up_proj / experts.down_proj) gives equal logits."""
    src = hf_checkpoints["olmoe"]
    dst = tmp_path / "fused"
    shutil.copytree(src, dst)
    tensors = {}
    for f in sorted(dst.glob("*.safetensors")):
        tensors.update(load_file(f))
        f.unlink()
    (dst / "model.safetensors.index.json").unlink()
    cfg = read_model_config(dst)
    for li in range(cfg.num_layers):
        p = f"model.layers.{li}.mlp.experts"
        gate_up, down = [], []
        for e in range(cfg.num_experts):
            gate_up.append(torch.cat([tensors.pop(f"{p}.{e}.gate_proj.weight"), tensors.pop(f"{p}.{e}.up_proj.weight")]))
            down.append(tensors.pop(f"{p}.{e}.down_proj.weight"))
        tensors[f"{p}.gate_up_proj"] = torch.stack(gate_up)
        tensors[f"{p}.down_proj"] = torch.stack(down)
    save_file(tensors, str(dst / "model.safetensors"))
    a = LLM(str(src), device=device, mode="paged", expert_cap=2).prompt_logits(PROMPT)
    b = LLM(str(dst), device=device, mode="paged", expert_cap=2).prompt_logits(PROMPT)
    assert torch.equal(a, b)


def test_hybrid_probes_each_bank_layout_once_and_each_layer_keeps_its_own(monkeypatch):
    """A Q4_K_M file keeps layer 0's down in Q4_K and layer 1's in Q6_K (tests/models/data/qwen3_moe_q4_k_m.gguf):
    hybrid probes the CPU's costs on each layout's bank, once, and each layer's CPU server assigns by its own."""
    pytest.importorskip("gguf")
    import wisp.models.loader as loader
    from tests.models.make_q4_k_m_fixture import FIXTURE
    from wisp.core.bank_keys import DOWN
    from wisp.core.learners.hybrid_costs import HybridCosts
    from wisp.models.expert_banks import bank_layout

    probed = []

    def probe(bank, device, cpu_kernel=None, dtype=None, activation=None):  # costs that name the layout's down codes
        probed.append(bank[DOWN].shape[-1])
        return HybridCosts(copy_s=1.0, cpu_rows=(1,), cpu_s_at_rows=(float(probed[-1]),))

    monkeypatch.setattr(loader, "probe_hybrid_costs", probe)
    llm = LLM(str(FIXTURE), device="cpu", mode="hybrid", expert_cap=2, moe_backend="torch")
    cfg = llm.engine.model_config
    assert sorted(probed) == [128, 192]  # Q4_K's code bytes a super-block, and Q6_K's: each layout probed once
    for li, store in llm.engine.model.experts.items():
        assert store.cpu.costs.cpu_s(1) == bank_layout(cfg, li)[DOWN][0][-1]
