"""Question: how fast does the in-graph UVA copy kernel (`device_pager._copy_misses`) move experts from pinned
host RAM, against the copy engine (cudaMemcpyAsync), and which grid makes it fastest? (GPU.)

Asked: 2026-12-04. A wide decode step streams its misses in waves of two staging rows through this kernel and
ran at 1.13x its roofline (about 48 GB/s over the copy phase against a 55 GB/s pinned probe).

Measured: Qwen3-30B-A3B expert banks in BF16 (gate_up [2 x 768, 2048], down [2048, 768]: 9.4 MB an expert),
64 masters pinned on the host. Each configuration copies `--waves` waves of `--rows` random experts, both
tensors, as `copy_wave` launches them (programs per tensor x chunk), then the copy engine moves the same
bytes expert by expert with `Tensor.copy_`. Grid: programs per wave and tensor, BLOCK (words per loop
step), num_warps. Times are CUDA events around the whole sequence, best of `--repeats`.

    python benchmarks/probes/uva_copy_rate.py [--out benchmarks/results/logs/uva_copy_rate_h200.json]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import triton

from wisp.core.experts.device_pager import _copy_misses, _words
from wisp.core.kernels.uva import device_view


def timed(fn, repeats: int) -> float:
    """Best wall time of `fn` in seconds over `repeats` runs, by CUDA events."""
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--waves", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    hidden, inter = 2048, 768
    host = {"gate_up": torch.randn(args.experts, 2 * inter, hidden, dtype=torch.bfloat16).pin_memory(),
            "down": torch.randn(args.experts, hidden, inter, dtype=torch.bfloat16).pin_memory()}
    staging = {k: torch.empty((args.rows,) + tuple(v.shape[1:]), dtype=v.dtype, device=dev) for k, v in host.items()}
    expert_bytes = sum(v[0].numel() * v.element_size() for v in host.values())
    total = expert_bytes * args.rows * args.waves
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(args.experts, generator=gen)[: args.rows * args.waves].to(torch.int32)
    experts = order.to(dev)
    rows = torch.arange(args.rows, dtype=torch.int32, device=dev)
    count = torch.tensor([order.numel()], dtype=torch.int32, device=dev)
    words = {k: (device_view(_words(v), dev), _words(staging[k])) for k, v in host.items()}

    def uva(programs: int, block: int, warps: int):
        def run():
            for wave in range(args.waves):
                for src, dst in words.values():
                    per = dst.shape[1]
                    chunk = max(triton.cdiv(per * args.rows, programs), block)
                    chunk = triton.cdiv(chunk, block) * block
                    _copy_misses[(args.rows, triton.cdiv(per, chunk))](
                        src, dst, experts, rows, count, wave * args.rows, per, CHUNK=chunk, BLOCK=block,
                        num_warps=warps)
        return run

    def engine():
        for i, e in enumerate(order.tolist()):
            for name, master in host.items():
                staging[name][i % args.rows].copy_(master[e], non_blocking=True)

    results = []
    s = timed(engine, args.repeats)
    results.append({"copy": "copy engine", "seconds": s, "gbps": total / s / 1e9})
    print(f"copy engine: {total / s / 1e9:.1f} GB/s", flush=True)
    for programs, block, warps in itertools.product((128, 256, 512, 1024), (512, 1024, 2048, 4096),
                                                    (4, 8, 16)):
        run = uva(programs, block, warps)
        run()  # compile
        s = timed(run, args.repeats)
        results.append({"copy": "uva kernel", "programs_per_tensor": programs, "block": block, "num_warps": warps,
                        "seconds": s, "gbps": total / s / 1e9})
        print(f"uva programs {programs:5d} block {block:5d} warps {warps:2d}: {total / s / 1e9:.1f} GB/s", flush=True)
    best = max((r for r in results if r["copy"] == "uva kernel"), key=lambda r: r["gbps"])
    print(f"best uva: {best}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "expert_bytes": expert_bytes, "rows": args.rows,
                       "waves": args.waves, "bytes": total, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
