"""Question: does hybrid's CPU path really run beside the link: does computing an expert on the CPU overlap a
copy over PCIe, and what does one layer gain? (One MoE layer of a preset's expert shapes, no model.)

Asked: 2026-12-01.

Answer (docs/hybrid.md; benchmarks/results/logs/hybrid_overlap_*.json, H200): only in part, since both read
the same host memory. A Mixtral-8x7B expert (352 MB) copies in 6.5 ms alone, computes on the CPU in 6.4-9.5
ms (8-16 threads), and the two at once take 7.9 ms; one layer with two misses takes 13.7 ms paged against
11.0 hybrid (1.25x at best). For small experts the CPU loses: OLMoE 0.96 ms paged against 1.82 hybrid,
Qwen3-30B-A3B 0.94 against 0.96.

Measures on the machine it runs on (a CUDA device), each the median over --repeats:
- copy_ms: one expert host (pinned) -> device, alone;
- cpu_ms[threads]: one expert on the CPU over one row (hybrid's "plain" kernel), alone, per torch thread count;
- cpu_during_copy_ms / copy_during_cpu_ms: the same two started together (copy on a copy stream, then
  the CPU kernel on this thread): how much each slows the other through host memory;
- step_ms: one layer's decode step at C = 2 (batch 1, top-2, both experts missing every step), paged
  against hybrid (HybridExperts with probed costs): the per-layer gain hybrid can give before any
  graph or scheduling cost.

  python benchmarks/probes/hybrid_overlap.py --model mixtral-8x7b --out hybrid_overlap_mixtral.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from wisp.bench.records import print_and_save
from wisp.core.experts.presets import ModelParts, build_store
from wisp.core.kernels.cpu_expert_kernels import plain_expert_mlp
from wisp.core.learners.hybrid_probe import probe_hybrid_costs
from wisp.core.kernels.registry import moe_kernels
from wisp.models.presets import preset


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = preset(args.model)
    d, inter = cfg["hidden_size"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    n = args.experts
    dev = torch.device("cuda")
    host = {"gate_up": torch.empty((n, 2 * inter, d), dtype=torch.bfloat16).pin_memory(),
            "down": torch.empty((n, d, inter), dtype=torch.bfloat16).pin_memory()}
    for t in host.values():
        t.uniform_(-0.02, 0.02)
    dest = {k: torch.empty(v.shape[1:], dtype=v.dtype, device=dev) for k, v in host.items()}
    copy_stream = torch.cuda.Stream()
    x = torch.randn((1, d)).to(torch.bfloat16)
    turn = iter(range(10**9))

    def copy(e):
        with torch.cuda.stream(copy_stream):
            for k, v in host.items():
                dest[k].copy_(v[e], non_blocking=True)

    def cpu(e):
        plain_expert_mlp(x, host["gate_up"][e], host["down"][e])

    rec = {"model": args.model, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "expert_mb": sum(v[0].numel() * 2 for v in host.values()) / 1e6}
    rec["copy_ms"] = timed(lambda: copy(next(turn) % n), args.repeats)
    threads0 = torch.get_num_threads()
    rec["cpu_ms"] = {}
    for threads in sorted({threads0, max(1, threads0 // 2), max(1, threads0 * 3 // 4)}):
        torch.set_num_threads(threads)
        rec["cpu_ms"][threads] = timed(lambda: cpu(next(turn) % n), args.repeats)
    torch.set_num_threads(threads0)
    cpu_alone, both = [], []
    for _ in range(args.repeats):
        e = next(turn) % n
        torch.cuda.synchronize()
        start = time.perf_counter()
        copy(e)
        cpu((e + 1) % n)
        cpu_done = time.perf_counter()
        torch.cuda.synchronize()
        cpu_alone.append(cpu_done - start)
        both.append(time.perf_counter() - start)
    rec["cpu_during_copy_ms"] = statistics.median(cpu_alone) * 1e3
    rec["both_ms"] = statistics.median(both) * 1e3
    kernels = moe_kernels("triton")
    costs = probe_hybrid_costs(host, dev)
    rec["probed"] = {"copy_ms": costs.copy_s * 1e3, "cpu_ms_1row": costs.cpu_s_at_rows[0] * 1e3}
    hidden = torch.randn((1, d), device=dev).to(torch.bfloat16)
    weights = torch.full((1, 2), 0.5, device=dev)
    rec["step_ms"] = {}
    for name in ("paged", "hybrid"):
        store = build_store(name, host, dev, 2, ModelParts(costs=costs), kernels=kernels)
        pairs = iter(range(10**9))

        def step():
            i = next(pairs) % (n // 2)
            ids = torch.tensor([[2 * i, 2 * i + 1]], device=dev)
            store.forward(hidden, ids, weights)

        with torch.inference_mode():
            rec["step_ms"][name] = timed(step, args.steps)
    print_and_save(rec, args.out)


if __name__ == "__main__":
    main()
