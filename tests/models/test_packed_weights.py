"""Checkpoints served from their own packed bytes beyond the experts' banks: a llama-quantize'd Q4_K_M file
(tests/models/data/qwen3_moe_q4_k_m.gguf) keeps its dense projections and LM head packed where the Triton GEMM reads
them (`BlockWeight`) and its experts are computed packed by hybrid's native CPU kernel, gate/up and down each in its
layer's type; the planner counts packed projections (the file's, an FP8 checkpoint's) at the bytes a model holds."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_hybrid_computes_packed_experts_on_the_cpu

gguf = pytest.importorskip("gguf")

PROMPT = [5, 17, 42, 8, 99, 3, 64]


def test_the_files_projections_stay_packed_and_give_the_dequantized_bits(monkeypatch):
    """Packing forced on the CPU (it is the Triton GEMM's on CUDA, outside resident mode; test_k_quants holds that GEMM
    to its dequantized twin): q, k, o and the LM head
    are the file's Q4_K / Q6_K bytes, v apart where its type differs from q's and k's, and the torch path, which
    dequantizes them right before the GEMM, gives the bits of the run that dequantized them at load."""
    import wisp.models.loader as loader
    from tests.models.make_q4_k_m_fixture import FIXTURE
    from wisp import LLM, SamplingParams
    from wisp.core.kernels.quantized_weights import BlockWeight

    stored = {t.name: t.tensor_type.name for t in gguf.GGUFReader(FIXTURE).tensors}
    plain = LLM(str(FIXTURE), device="cpu", mode="paged", expert_cap=2)
    monkeypatch.setattr(loader, "packs_projections", lambda *a: True)
    packed = LLM(str(FIXTURE), device="cpu", mode="paged", expert_cap=2)
    attn = packed.model.layers[0].attn
    assert isinstance(attn.q, BlockWeight) and attn.q.format == stored["blk.0.attn_q.weight"].lower()
    assert isinstance(attn.o, BlockWeight) and attn.o.format == stored["blk.0.attn_output.weight"].lower()
    assert isinstance(packed.model.lm_head, BlockWeight) and packed.model.lm_head.format == stored["output.weight"].lower()
    assert attn.q.shape == plain.model.layers[0].attn.q.shape
    assert torch.equal(attn.q.dequantized(torch.bfloat16), plain.model.layers[0].attn.q)
    assert torch.equal(packed.prompt_logits(PROMPT), plain.prompt_logits(PROMPT))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    assert packed.generate([PROMPT], params)[0].token_ids == plain.generate([PROMPT], params)[0].token_ids


def test_hybrids_native_cpu_kernel_computes_the_files_experts_packed(tmp_path):
    """Layer 0's experts all Q4_K, layer 1's down in Q6_K: the native kernel takes both, from the packed banks."""
    from tests.models.make_q4_k_m_fixture import FIXTURE
    from tests.models.test_gguf_k_quants import q4_k_m_twin

    # the twin's weights are rounded to bf16, the packed ones exact: logits up to about 9 differ by up to 0.06
    assert_hybrid_computes_packed_experts_on_the_cpu(FIXTURE, q4_k_m_twin(tmp_path), PROMPT, tolerance=1e-1)


def held_bytes(obj, seen: set[int]) -> int:
    """Bytes of the tensors reachable from `obj` (tensors, packed weights, dataclasses, lists), each storage once."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        key = obj.untyped_storage().data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # BlockWeight, Fp8BlockWeight
        return sum(held_bytes(t, seen) for t in obj)
    if dataclasses.is_dataclass(obj):
        return sum(held_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if isinstance(obj, (list, tuple)):
        return sum(held_bytes(t, seen) for t in obj)
    return 0


def test_the_planner_counts_the_packed_projections_at_the_bytes_the_model_holds(monkeypatch):
    """`ModelSizes` with the projections packed: the file's bytes for them (`packed_projection_sizes`, from its
    tensors), and in all exactly the non-expert bytes a model loaded so holds (beside the two staging buffers)."""
    import wisp.models.loader as loader
    from tests.models.make_q4_k_m_fixture import FIXTURE
    from wisp import LLM
    from wisp.core.kernels.gguf_blocks import BLOCKS
    from wisp.plan.sizes import ModelSizes

    tensors = gguf.GGUFReader(FIXTURE).tensors
    projections = [t for t in tensors if t.tensor_type.name in BLOCKS and (t.name == "output.weight" or t.name.endswith(
        (".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight")))]
    monkeypatch.setattr(loader, "packs_projections", lambda *a: True)
    llm = LLM(str(FIXTURE), device="cpu", mode="paged", expert_cap=2)
    cfg, model = llm.config, llm.model
    assert cfg.packed_projection_sizes == (sum(int(t.n_elements) for t in projections),
                                           sum(int(t.n_bytes) for t in projections))
    seen: set[int] = set()
    held = held_bytes([model.layers, model.embed.table, model.final_norm, model.lm_head], seen)
    sizes = ModelSizes.of(cfg, 16, packed_projections=True)
    assert sizes.non_expert_bytes - 2 * cfg.expert_bytes == held
    assert ModelSizes.of(cfg, 16).non_expert_bytes - sizes.non_expert_bytes > 0  # what packing gives back


def test_the_planner_counts_an_fp8_checkpoints_packed_projections_at_the_bytes_the_model_holds(monkeypatch, tmp_path):
    """The same for an FP8 checkpoint's attention projections (float8 codes and their float32 block scales)."""
    import wisp.models.loader as loader
    from tests.models.test_fp8_checkpoint import FP8_QWEN3
    from wisp import LLM
    from wisp.core.kernels.fp8_blocks import Fp8BlockWeight
    from wisp.models.random_checkpoint import write_random_checkpoint
    from wisp.plan.sizes import ModelSizes

    folder = write_random_checkpoint(FP8_QWEN3, tmp_path / "fp8", seed=3)
    monkeypatch.setattr(loader, "packs_projections", lambda *a: True)
    llm = LLM(str(folder), device="cpu", mode="paged", expert_cap=2)
    assert isinstance(llm.model.layers[0].attn.q, Fp8BlockWeight)
    held = held_bytes([llm.model.layers, llm.model.embed.table, llm.model.final_norm, llm.model.lm_head], set())
    assert ModelSizes.of(llm.config, 16, packed_projections=True).non_expert_bytes - 2 * llm.config.expert_bytes == held


@pytest.mark.slow
def test_a_llama_architecture_files_q_and_k_rows_are_put_back_in_rotary_order_packed(monkeypatch, tmp_path):
    """Mixtral as llama.cpp's converter writes it (the `llama` architecture: q and k rows permuted for its rotation of
    adjacent pairs), all in Q8_0: packed, each row of codes and scales moved back whole, the run keeps the bits of the
    run that dequantized the same file at load."""
    import wisp.models.loader as loader
    from tests.models.test_gguf import hf_checkpoint, write_gguf
    from wisp import LLM
    from wisp.core.kernels.quantized_weights import BlockWeight

    folder = hf_checkpoint("mixtral", tmp_path / "hf", wide=256)
    file = write_gguf("mixtral", folder, tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q8_0)[0]
    plain = LLM(str(file), device="cpu", mode="paged", expert_cap=2)
    monkeypatch.setattr(loader, "packs_projections", lambda *a: True)
    packed = LLM(str(file), device="cpu", mode="paged", expert_cap=2)
    q = packed.model.layers[0].attn.q
    assert isinstance(q, BlockWeight) and torch.equal(q.dequantized(torch.bfloat16), plain.model.layers[0].attn.q)
    assert torch.equal(packed.prompt_logits(PROMPT), plain.prompt_logits(PROMPT))


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v2"])
def test_the_planner_counts_every_packed_projection_a_family_loads(family, monkeypatch, tmp_path):
    """A Q8_0 file's shared experts (Qwen2-MoE, DeepSeek-V2), first dense layer and LM head (DeepSeek-V2, whose latent
    attention is dequantized) stay packed beside its attention's: the planner counts each at the file's bytes, so the
    non-expert bytes it plans are the ones a model loaded so holds."""
    import wisp.models.loader as loader
    from tests.models.test_gguf import hf_checkpoint, write_gguf
    from wisp import LLM
    from wisp.core.kernels.quantized_weights import BlockWeight
    from wisp.plan.sizes import ModelSizes

    widths = {"qwen2_moe": dict(intermediate_size=64, shared_expert_intermediate_size=64),  # whole Q8_0 blocks
              "deepseek_v2": dict(intermediate_size=64, kv_lora_rank=32, qk_nope_head_dim=32, v_head_dim=32)}[family]
    file = write_gguf(family, hf_checkpoint(family, tmp_path / "hf", wide=64, **widths), tmp_path / "f.gguf",
                      gguf.GGMLQuantizationType.Q8_0)[0]
    monkeypatch.setattr(loader, "packs_projections", lambda *a: True)
    llm = LLM(str(file), device="cpu", mode="paged", expert_cap=2)
    model = llm.model
    assert isinstance(model.lm_head, BlockWeight) and any(isinstance(lw.shared.gate, BlockWeight) for lw in model.layers
                                                          if lw.shared is not None)
    held = held_bytes([model.layers, model.embed.table, model.final_norm, model.lm_head], set())
    assert ModelSizes.of(llm.config, 16, packed_projections=True).non_expert_bytes - 2 * llm.config.expert_bytes == held
