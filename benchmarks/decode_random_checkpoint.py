"""Decode benchmark on a random checkpoint with a real model's shapes (default: Qwen3-30B-A3B).

Writes the checkpoint in Hugging Face layout (per-expert tensors, one shard per layer), loads it with
`wisp.LLM` in each requested mode, and measures one batch-1 decode: tok/s, TTFT, hit rate, bytes
copied per token, peak GPU memory after load and during decode, plus a pinned host->device bandwidth
probe in the same process. Prints a table and writes JSON.

    python benchmarks/decode_random_checkpoint.py --layers 24 --modes paged:16,resident,offload \
        --prompt-len 32 --decode-tokens 64 --out results.json

Random weights route near-uniformly, so the hit rate here is a floor for real traffic. The engine
is stepped by hand so the counters can be split between prefill and decode.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from wisp import LLM, SamplingParams
from wisp.models.presets import QWEN3_30B_A3B
from wisp.models.random_checkpoint import write_random_checkpoint


def probe_h2d_gbps(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def _peak(device: str) -> int:
    return torch.cuda.max_memory_allocated() if device == "cuda" else 0


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_mode(path: Path, mode: str, cap: int | None, args, device: str) -> dict:
    _reset_peak(device)
    t0 = time.perf_counter()
    llm = LLM(str(path), device=device, mode=mode, expert_cap=cap, dtype="bfloat16" if device == "cuda" else None,
              max_concurrency=1, max_model_len=args.prompt_len + args.decode_tokens + 8, moe_backend=args.moe_backend)
    load_s = time.perf_counter() - t0
    peak_load = _peak(device)
    prompt = torch.randint(0, llm.config.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    llm.generate([prompt], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up (allocator, kernels)
    llm.reset_stats()
    _reset_peak(device)
    # prefill, then decode, driven step by step so the counters can be split at the first token
    params = SamplingParams(max_tokens=args.decode_tokens + 1, ignore_eos=True, temperature=args.temperature, seed=0)
    t_start = time.perf_counter()
    engine = llm.engine
    engine.add_request("bench", prompt, params, strict_length=False)
    seq = engine.requests["bench"]
    engine.step()  # the prefill, which samples the first token
    prefill = llm.stats()
    t_first = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    t_end = time.perf_counter()
    s = llm.stats()
    ttft = t_first - t_start
    decode_s = t_end - t_first
    n_dec = len(seq.output_ids) - 1
    decode_bytes = s["bytes_h2d"] - prefill["bytes_h2d"]
    hits = s["expert_hits"] - prefill["expert_hits"]
    routed = hits + s["expert_misses"] - prefill["expert_misses"]
    return {
        "mode": mode,
        "expert_cap": llm.expert_cap,
        "layers": llm.config.num_layers,
        "prompt_len": args.prompt_len,
        "decode_tokens": n_dec,
        "temperature": args.temperature,
        "moe_backend": args.moe_backend,
        "load_s": round(load_s, 2),
        "ttft_s": round(ttft, 4),
        "decode_tok_s": round(n_dec / decode_s, 2),
        "step_s": round(decode_s / n_dec, 5),
        "hit_rate": round(hits / routed, 4) if routed else 0.0,
        "bytes_h2d_prefill": prefill["bytes_h2d"],
        "bytes_h2d_per_token": round(decode_bytes / n_dec),
        "h2d_gbps_achieved": round(decode_bytes / decode_s / 1e9, 2),
        "expert_device_bytes": s["expert_device_bytes"],
        "peak_gpu_bytes_load": peak_load,
        "peak_gpu_bytes_decode": _peak(device),
        "moe_steps": s["moe_steps"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--modes", default="paged:16,resident", help="comma list of mode[:cap]")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--offload-decode-tokens", type=int, default=8, help="offload copies every expert: keep it short")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="sampling keeps a random model from looping on one token (which would fake a high hit rate)")
    ap.add_argument("--workdir", default="/tmp/wisp-bench-ckpt")
    ap.add_argument("--keep", action="store_true", help="keep the written checkpoint")
    ap.add_argument("--out", default=None)
    ap.add_argument("--moe-backend", default="torch", choices=["torch", "triton"])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, to check the script itself")
    args = ap.parse_args()
    ap_device = "cuda" if torch.cuda.is_available() else "cpu"
    if ap_device == "cpu" and not args.smoke:
        print("this benchmark needs a CUDA device (--smoke runs a tiny CPU version)", file=sys.stderr)
        return 2
    cfg = dict(QWEN3_30B_A3B, num_hidden_layers=args.layers)
    if args.smoke:
        cfg.update(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                   moe_intermediate_size=32, num_experts=32, intermediate_size=64, dtype="float32")
    path = Path(args.workdir)
    if not (path / "config.json").is_file():
        t0 = time.perf_counter()
        write_random_checkpoint(cfg, path, seed=0, device=ap_device)
        print(f"wrote {args.layers}-layer checkpoint in {time.perf_counter() - t0:.1f} s", flush=True)
    gbps = probe_h2d_gbps() if ap_device == "cuda" else 0.0
    gpu = torch.cuda.get_device_name() if ap_device == "cuda" else "cpu"
    results = []
    for item in args.modes.split(","):
        mode, _, cap = item.partition(":")
        run_args = argparse.Namespace(**vars(args))
        if mode == "offload":
            run_args.decode_tokens = args.offload_decode_tokens
        r = run_mode(path, mode, int(cap) if cap else None, run_args, ap_device)
        r.update(gpu=gpu, h2d_gbps_probe=round(gbps, 1), command=" ".join(sys.argv))
        results.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n{'mode':9} {'cap':>4} {'tok/s':>8} {'ttft s':>7} {'hit':>6} {'MB/token':>9} {'peak load GB':>12} {'peak dec GB':>11}")
    for r in results:
        print(
            f"{r['mode']:9} {r['expert_cap']:>4} {r['decode_tok_s']:>8} {r['ttft_s']:>7} {r['hit_rate']:>6} "
            f"{r['bytes_h2d_per_token'] / 1e6:>9.1f} {r['peak_gpu_bytes_load'] / 1e9:>12.2f} {r['peak_gpu_bytes_decode'] / 1e9:>11.2f}"
        )
    print(f"pinned H2D probe: {gbps:.1f} GB/s on {gpu}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
