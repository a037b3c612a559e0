"""The offline configurator: model shape + traces + cost model -> a plan for both pools (`wisp plan`).

Pageable budget B = VRAM budget - non-expert weights - a reserve for activations and workspace. The
expert side is measured by the routing trace's exact per-layer LRU miss curves (misses per token), the
KV side by the KV trace's prefix-cache miss curve (block misses per request); both are put in seconds
per request with c_exp = M_e * t_byte, c_kv = beta * block_size and `tokens_per_request` (the KV
trace's mean output length unless given). Without a KV trace the KV side has no measured reuse, so
everything above the admission floor goes to experts.

The plan is a pure function of its inputs: give --t-byte and --recompute-cost and it is deterministic.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from wisp.config import ModelConfig
from wisp.plan.split import SplitProblem, equimarginal_cap, latency, per_layer_caps, split
from wisp.plan.miss_curves import expert_miss_curve, kv_miss_curve
from wisp.engine.kv_cache import KVCache
from wisp.errors import WispError
from wisp.trace.format import RoutingTrace
from wisp.trace.kv_trace import KVTrace

GiB = 1 << 30


@dataclass(frozen=True)
class PlanInputs:
    vram_budget: int
    max_concurrency: int
    max_model_len: int
    block_size: int = 16
    t_byte: float | None = None  # seconds per host->device byte; None: probe
    recompute_cost: float | None = None  # seconds per recomputed token; None: estimate
    reserve_bytes: int = GiB // 2
    tokens_per_request: int | None = None


@dataclass(frozen=True)
class ModelSizes:
    non_expert_bytes: int  # weights outside the routed experts, plus the two expert-sized staging buffers
    expert_bytes: int  # M_e: one expert
    slot_bytes: int  # a: one slot in every MoE layer
    block_bytes: int  # b: one KV block across layers

    @classmethod
    def of(cls, cfg: ModelConfig, block_size: int) -> "ModelSizes":
        el = torch.empty((), dtype=cfg.dtype).element_size()
        d, hd = cfg.hidden_size, cfg.head_dim
        attn = d * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 2 * d
        if cfg.attention_bias:
            attn += hd * (cfg.num_heads + 2 * cfg.num_kv_heads)
        per_layer = []
        for moe in cfg.moe_layers:
            mlp = 3 * d * cfg.dense_intermediate_size if not moe else cfg.num_experts * d
            if moe and cfg.shared_expert_intermediate_size:
                mlp += 3 * d * cfg.shared_expert_intermediate_size + d
            per_layer.append(attn + mlp)
        embed = cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2)
        kv_block = KVCache.block_bytes(cfg.num_layers, cfg.num_kv_heads, hd, block_size, cfg.dtype)
        staging = 2 * cfg.expert_bytes  # paged mode's two staging buffers for wide steps (`wisp.core.expert_major`)
        return cls((sum(per_layer) + embed + d) * el + staging, cfg.expert_bytes, len(cfg.moe_layer_ids) * cfg.expert_bytes,
                   kv_block)


def probe_t_byte(device: torch.device, nbytes: int = 256 << 20) -> float:
    """Seconds per byte of a host->device copy (pinned on CUDA), best of 5."""
    cuda = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best / nbytes


def estimate_recompute_cost(cfg: ModelConfig, device: torch.device) -> float:
    """Seconds per prefill token: the model's active FLOPs per token at this device's measured GEMM rate."""
    d = cfg.hidden_size
    active = 2 * (d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * cfg.moe_intermediate_size * cfg.top_k)
    flops_per_token = active * cfg.num_layers + 2 * cfg.vocab_size * d
    a = torch.randn(512, d, device=device).to(cfg.dtype)
    b = torch.randn(d, 4 * d, device=device).to(cfg.dtype)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - t0)
    rate = 2 * 512 * d * 4 * d / best
    return flops_per_token / rate


def layer_curves(trace: RoutingTrace, cfg: ModelConfig) -> list[np.ndarray]:
    """Per model MoE layer: misses per token for C = 0..N (trace layers reused cyclically if fewer).

    Each token is its own step here: the batch-1 decode view the plan prices. (A recorded wide step, a
    prefill chunk, is one pager step too, run expert-major, and `expert_miss_curve` of the recorded
    steps replays it exactly; per token, reuse inside a prefill counts as decode reuse.)"""
    if trace.num_experts > cfg.num_experts:
        raise WispError(f"the routing trace has {trace.num_experts} experts but the model has {cfg.num_experts}")
    curves = [expert_miss_curve(trace.steps(layer, per_token=True), cfg.num_experts) / max(trace.num_tokens, 1)
              for layer in trace.layers]
    return [curves[i % len(curves)] for i in range(len(cfg.moe_layer_ids))]


def make_plan(cfg: ModelConfig, inputs: PlanInputs, trace: RoutingTrace, kv: KVTrace | None, device: torch.device) -> dict:
    sizes = ModelSizes.of(cfg, inputs.block_size)
    t_byte = inputs.t_byte if inputs.t_byte is not None else probe_t_byte(device)
    beta = inputs.recompute_cost if inputs.recompute_cost is not None else estimate_recompute_cost(cfg, device)
    pageable = inputs.vram_budget - sizes.non_expert_bytes - inputs.reserve_bytes
    floor = inputs.max_concurrency * -(-inputs.max_model_len // inputs.block_size)
    per_layer = layer_curves(trace, cfg)
    exp_curve = np.sum(per_layer, axis=0)  # misses per token, all layers, uniform C
    tokens = inputs.tokens_per_request or (int(np.mean(kv.output_tokens)) if kv and kv.output_tokens else 256)
    if kv is not None:
        kv_per_request = kv_miss_curve(kv.requests, max(kv.max_blocks * 8, floor * 2)) / max(len(kv.requests), 1)
    else:
        kv_per_request = np.zeros(1)
    problem = SplitProblem(
        budget_bytes=max(pageable, 0),
        slot_bytes=sizes.slot_bytes,
        block_bytes=sizes.block_bytes,
        expert_cost=sizes.expert_bytes * t_byte * tokens,
        kv_cost=beta * inputs.block_size,
        min_cap=cfg.top_k,
        max_cap=cfg.num_experts,
        kv_floor=floor,
    )
    best = split(problem, exp_curve, kv_per_request)
    if best is None:
        need = problem.smallest_feasible_budget() + sizes.non_expert_bytes + inputs.reserve_bytes
        raise WispError(
            f"a {inputs.vram_budget / GiB:.2f} GiB budget cannot serve --max-concurrency {inputs.max_concurrency} x "
            f"--max-model-len {inputs.max_model_len}: the smallest budget that does is {need / GiB:.2f} GiB ({need} bytes)"
        )
    free = split(problem, exp_curve, kv_per_request, floor=False)
    caps = per_layer_caps(per_layer, best.expert_cap * len(per_layer), cfg.top_k, cfg.num_experts)
    per_layer_misses = float(sum(c[k] for c, k in zip(per_layer, caps)))
    if per_layer_misses > best.expert_misses:  # greedy can lose on non-convex curves: never worse than uniform
        caps, per_layer_misses = [best.expert_cap] * len(per_layer), best.expert_misses
    return {
        "model": cfg.architecture,
        "expert_cap": best.expert_cap,
        "per_layer_caps": caps,
        "kv_blocks": best.kv_blocks,
        "kv_bytes": best.kv_blocks * sizes.block_bytes,
        "kv_block_size": inputs.block_size,
        "expert_bytes": best.expert_cap * sizes.slot_bytes,
        "budget_bytes": inputs.vram_budget,
        "pageable_bytes": problem.budget_bytes,
        "non_expert_bytes": sizes.non_expert_bytes,
        "reserve_bytes": inputs.reserve_bytes,
        "slot_bytes": sizes.slot_bytes,
        "block_bytes": sizes.block_bytes,
        "admission_floor_blocks": floor,
        "max_concurrency": inputs.max_concurrency,
        "max_model_len": inputs.max_model_len,
        "predicted_expert_misses_per_token": best.expert_misses,
        "predicted_expert_misses_per_token_per_layer_caps": per_layer_misses,
        "predicted_kv_block_misses_per_request": best.kv_misses,
        "predicted_latency_s": best.latency,
        "equimarginal_cap": equimarginal_cap(problem, exp_curve, kv_per_request),
        "unconstrained": {"expert_cap": free.expert_cap, "kv_blocks": free.kv_blocks, "predicted_latency_s": free.latency},
        "cost_model": {"t_byte_s": t_byte, "recompute_cost_s_per_token": beta, "tokens_per_request": tokens,
                       "c_exp_s": sizes.expert_bytes * t_byte, "c_kv_s": beta * inputs.block_size},
        "trace": {"tokens": trace.num_tokens, "layers": len(trace.layers), "kv_requests": len(kv.requests) if kv else 0},
        "_curves": {"expert": exp_curve.tolist(), "kv": kv_per_request.tolist(), "problem": asdict(problem)},
    }


def latency_by_cap(plan: dict) -> tuple[list[int], list[float], list[float]]:
    p = SplitProblem(**plan["_curves"]["problem"])
    exp, kv = np.array(plan["_curves"]["expert"]), np.array(plan["_curves"]["kv"])
    caps = list(p.feasible_caps(floor=False))
    lat = [latency(p, exp, kv, c).latency for c in caps]
    fractions = [c * p.slot_bytes / p.budget_bytes for c in caps]
    return caps, fractions, lat


def write_plan(plan: dict, path: str | Path) -> None:
    public = {k: v for k, v in plan.items() if not k.startswith("_")}
    Path(path).write_text(json.dumps(public, indent=1))


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or a WispError saying how to get it (--plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WispError("--plot needs matplotlib: pip install matplotlib") from None
    return plt


def plot_plan(plan: dict, path: str | Path) -> None:
    plt = pyplot()
    caps, fractions, lat = latency_by_cap(plan)
    exp, kv = plan["_curves"]["expert"], plan["_curves"]["kv"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].plot(range(len(exp)), exp)
    ax[0].axvline(plan["expert_cap"], color="C3", ls="--", label=f"C = {plan['expert_cap']}")
    ax[0].set(xlabel="expert slots per layer (C)", ylabel="expert misses per token", title="expert miss curve (LRU, exact)")
    ax[0].legend()
    ax[1].plot(range(len(kv)), kv)
    ax[1].axvline(plan["kv_blocks"], color="C3", ls="--", label=f"kappa = {plan['kv_blocks']}")
    ax[1].axvline(plan["admission_floor_blocks"], color="k", ls=":", label="admission floor")
    ax[1].set(xlabel="KV blocks (kappa)", ylabel="block misses per request", title="KV miss curve (prefix cache, exact)")
    ax[1].legend()
    ax[2].plot(fractions, lat)
    ax[2].axvline(plan["expert_bytes"] / plan["pageable_bytes"], color="C3", ls="--", label="chosen f")
    floor_f = 1 - plan["admission_floor_blocks"] * plan["block_bytes"] / plan["pageable_bytes"]
    ax[2].axvspan(floor_f, max(fractions + [floor_f]), color="0.85", label="below the KV floor")
    ax[2].set(xlabel="expert fraction f of the pageable budget", ylabel="predicted latency per request (s)", title="T(f)")
    ax[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
