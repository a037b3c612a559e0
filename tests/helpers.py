"""Helpers the test modules share (import them from here; tests/conftest.py keeps only fixtures,
options and hooks): small random Hugging Face models of every supported family, and random routing traces."""

from __future__ import annotations

import torch

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=None,
    pad_token_id=0,
    bos_token_id=None,
    tie_word_embeddings=False,
)

# family -> (config class, model class, config kwargs); each exercises that family's quirks
FAMILY_SPECS = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             intermediate_size=48, norm_topk_prob=True, mlp_only_layers=[1]),
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(num_hidden_layers=2, num_experts=8, num_experts_per_tok=2, intermediate_size=32, norm_topk_prob=False),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=48,
             shared_expert_intermediate_size=40, decoder_sparse_step=2, norm_topk_prob=False),
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(num_hidden_layers=3, head_dim=16, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
             sliding_window=4, swiglu_limit=1.5,  # a window the prompts outrun; a clamp the activations reach
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                              "beta_slow": 1.0, "original_max_position_embeddings": 64, "truncate": False}),
    ),
    "deepseek_v2": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
             moe_intermediate_size=32, intermediate_size=48, first_k_dense_replace=1, routed_scaling_factor=1.5,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                              "mscale_all_dim": 0.707, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                              "beta_slow": 1.0}),
    ),
}
FAMILIES = list(FAMILY_SPECS)


def make_hf_model(family: str, seed: int = 0):
    import transformers

    cfg_cls, model_cls, kwargs = FAMILY_SPECS[family]
    torch.manual_seed(seed)
    config = getattr(transformers, cfg_cls)(**{**COMMON, **kwargs})
    model = getattr(transformers, model_cls)(config).eval()
    for module in model.modules():  # transformers before 5.2x fixed GPT-OSS's SwiGLU constants, ignoring the config
        if hasattr(module, "limit") and hasattr(config, "swiglu_limit"):
            module.alpha, module.limit = getattr(config, "swiglu_alpha", module.alpha), config.swiglu_limit
    with torch.no_grad():  # HF's init is tiny (std 0.02); widen it so routing and logits are far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not name.endswith("_bias"):
                p.normal_(0.0, 0.5 if "embed" in name else 0.15)
            elif family == "gpt_oss" and ("bias" in name or "sinks" in name):  # HF zeroes the expert biases
                p.normal_(0.0, 0.3)
    return model


def run_prompt(path, mode: str, cap, device: str, moe_backend: str, attention_backend: str, prompt: list[int]):
    """(prefill logits, an 8-token greedy output with its logits, the LLM) of one checkpoint in one mode."""
    from wisp import LLM, SamplingParams

    backend = moe_backend if moe_backend != "auto" or not device.startswith("cuda") else "triton"
    llm = LLM(str(path), device=device, mode=mode, expert_cap=cap, moe_backend=backend,
              attention_backend=attention_backend)
    prefill = llm.prompt_logits(prompt)
    out = llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True), return_logits=True)[0]
    return prefill, out, llm


def assert_quantized_gives_its_twins_bits(quantized, twin, mode, cap, device, moe_backend, attention_backend, prompt):
    """A quantized checkpoint in `mode` against the plain checkpoint of its dequantized weights in the same mode:
    torch.equal where the kernels dequantize in one summation order (torch; Triton interpreted); compiled Triton
    sums a quantized tile in another order than a plain one, so there: close, and the quantized checkpoint's
    every mode (but hybrid) gives its resident bits. Returns the two LLMs."""
    import torch

    pq, oq, llm_q = run_prompt(quantized, mode, cap, device, moe_backend, attention_backend, prompt)
    pp, op, llm_p = run_prompt(twin, mode, cap, device, moe_backend, attention_backend, prompt)
    # on CUDA hybrid's split follows measured costs, which two runs need not share, and its CPU rounds its own way
    if not device.startswith("cuda") or (moe_backend == "torch" and mode != "hybrid"):  # auto is Triton on CUDA
        assert torch.equal(pq, pp) and oq.token_ids == op.token_ids
        assert all(torch.equal(a, b) for a, b in zip(oq.logits, op.logits))
    else:
        torch.testing.assert_close(pq, pp, rtol=3e-2, atol=3e-2)
        if mode != "hybrid":
            rq, ro, _ = run_prompt(quantized, "resident", None, device, moe_backend, attention_backend, prompt)
            assert torch.equal(pq, rq) and oq.token_ids == ro.token_ids
    return llm_q, llm_p


def assert_hybrid_computes_packed_experts_on_the_cpu(quantized, twin, prompt, tolerance: float):
    """Hybrid on the CPU with the native CPU kernel: the quantized checkpoint's CPU experts are computed from its packed
    bank in every layer (the kernel reads that format, and computed some), its logits within `tolerance` of its
    dequantized twin's (the native kernel sums a quantized weight's scale groups apart, and does not round its weights:
    the twin's are rounded to bf16)."""
    import torch

    from wisp import LLM, SamplingParams
    from wisp.core.kernels.cpu_expert_kernels import applies
    from wisp.core.learners.hybrid_costs import HybridCosts

    cpu_cheap = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))  # misses go to the CPU
    outs = []
    for path in (quantized, twin):
        llm = LLM(str(path), device="cpu", mode="hybrid", expert_cap=2, hybrid_cpu_kernel="native",
                  hybrid_costs=cpu_cheap)
        out = llm.generate([prompt], SamplingParams(max_tokens=6, ignore_eos=True), return_logits=True)[0]
        assert llm.stats()["expert_cpu_computed"] > 0
        outs.append(torch.stack(out.logits).float())
        if path == quantized:
            for store in llm.engine.model.experts.values():  # every layer's (a GGUF file's may differ by layer)
                host = store.cpu.cpu_experts
                assert store.cpu.cpu_kernel == "native" and host.extras[0] is not None and host.extras[0].scales is not None
                assert applies(host.gate_ups[0], host.downs[0], host.extras[0])  # read packed, not handed to torch
    torch.testing.assert_close(outs[0], outs[1], rtol=tolerance, atol=tolerance)


def routing_traces(max_tokens: int = 10):
    """A hypothesis strategy: (ids [T, L, K] with distinct experts per cell and a few cells missing (-1),
    the number of experts)."""
    import numpy as np
    from hypothesis import strategies as st

    @st.composite
    def traces(draw):
        n = draw(st.integers(2, 7))
        k = draw(st.integers(1, min(n, 3)))
        layers = draw(st.integers(1, 3))
        tokens = draw(st.integers(1, max_tokens))
        ids = np.full((tokens, layers, k), -1, dtype=np.int16)
        for t in range(tokens):
            for layer in range(layers):
                if draw(st.integers(0, 9)) > 0:
                    ids[t, layer] = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k, unique=True))
        return ids, n

    return traces()


def demo_routing():
    """The trained demo's routing over its held-out text (`wisp.models.demo.TRAINED_DEMO_ROUTING`): real routing of a
    trained router, shipped with the package, so tests beside the synthetic traces never skip for want of it."""
    from wisp.models.demo import TRAINED_DEMO_ROUTING
    from wisp.trace.format import RoutingTrace

    return RoutingTrace.load(TRAINED_DEMO_ROUTING)


def assert_the_same_on_one_thread_and_more(call) -> None:
    """call() gives the same bits on one thread as on all of them (at least two)."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = call()
        torch.set_num_threads(max(2, threads))
        assert torch.equal(call(), one)
    finally:
        torch.set_num_threads(threads)
