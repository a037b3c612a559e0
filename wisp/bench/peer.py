"""The peer in the decode benchmark: transformers + accelerate with every layer's experts on the CPU.

What a user gets today without wisp: the Hugging Face model with a device map that puts each MoE layer's
experts module on "cpu" and everything else on the GPU; accelerate's hooks copy a layer's experts to
the GPU at every forward (layer offload). Weights are random (the preset's shape), built on the meta
device and materialised in host memory, so no checkpoint is needed. Greedy `generate` with the same
prompt length; decode speed = (time of 1 + N tokens - time of 1 token) / N.
"""

from __future__ import annotations

import re
import time

import torch

from wisp.errors import WispError
from wisp.models.presets import preset

EXPERTS = re.compile(r"\.layers\.\d+\.(mlp|block_sparse_moe)\.experts$")


def _device_map(model: torch.nn.Module) -> dict[str, str | int]:
    """Experts modules -> "cpu", everything else -> GPU 0, with no entry nested inside another."""
    names = [n for n, _ in model.named_modules() if EXPERTS.search("." + n)]
    if not names:
        raise WispError("the peer found no experts module to offload in this transformers version")
    out: dict[str, str | int] = {}

    def visit(prefix: str, module: torch.nn.Module) -> None:
        if prefix in names:
            out[prefix] = "cpu"
            return
        if not any(n.startswith(prefix + ".") or not prefix for n in names):
            out[prefix] = 0
            return
        for pname, _ in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            out[f"{prefix}.{pname}" if prefix else pname] = 0
        for cname, child in module.named_children():
            visit(f"{prefix}.{cname}" if prefix else cname, child)

    visit("", model)
    return out


def build_offloaded(name: str, dtype=torch.bfloat16):
    from accelerate import dispatch_model
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(preset(name))
    config = AutoConfig.for_model(raw.pop("model_type"), **{k: v for k, v in raw.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # norms
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(0.02)) if p.numel() < 1 << 26 \
                    else p.normal_(0.0, 0.02, generator=gen)
        for bname, buf in model.named_buffers():
            if bname.endswith("inv_freq"):  # rotary buffers are computed at init, lost by the meta build
                hd = buf.numel() * 2
                theta = float(raw.get("rope_theta", 10000.0))
                buf.copy_(1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    model.eval()
    return dispatch_model(model, device_map=_device_map(model), main_device=0)


def run_accelerate(name: str, prompt_len: int, decode_tokens: int) -> dict:
    t0 = time.perf_counter()
    model = build_offloaded(name)
    load_s = time.perf_counter() - t0
    cfg = model.config
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), generator=gen).cuda()

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(1)  # warm-up
    torch.cuda.reset_peak_memory_stats()
    ttft = timed(1)
    total = timed(1 + decode_tokens)
    step = (total - ttft) / decode_tokens
    n_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts")
    inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    layer_bytes = n_experts * 3 * cfg.hidden_size * inter * 2
    per_token = layer_bytes * cfg.num_hidden_layers  # every layer's experts cross PCIe each forward
    return {
        "mode": "accelerate",
        "expert_cap": n_experts,
        "layers": cfg.num_hidden_layers,
        "prompt_len": prompt_len,
        "decode_tokens": decode_tokens,
        "temperature": 0.0,
        "load_s": round(load_s, 2),
        "ttft_s": round(ttft, 4),
        "decode_tok_s": round(1 / step, 3),
        "step_s": round(step, 6),
        "hit_rate": 0.0,
        "bytes_h2d_per_token": per_token,
        "h2d_gbps_achieved": round(per_token / step / 1e9, 3),
        "expert_device_bytes": 0,
        "peak_gpu_bytes_load": 0,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "device": "cuda",
        "graph_steps": 0,
        "routing": "router",
        "peer": "transformers + accelerate dispatch_model, experts on cpu",
    }
