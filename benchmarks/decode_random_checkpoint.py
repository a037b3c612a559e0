"""Decode benchmark on a random checkpoint *written to disk* with a real model's shapes (default:
Qwen3-30B-A3B), so loading goes through safetensors exactly as a user's checkpoint does; the measuring
itself is `wisp bench decode` (wisp/bench/decode.py).

    python benchmarks/decode_random_checkpoint.py --layers 24 --modes paged:16,resident,offload \
        --prompt-len 32 --decode-tokens 64 --out results.json

Random weights route more consistently than a trained model, so hit rates here flatter real traffic.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from wisp.bench.decode import bench_decode
from wisp.models.presets import QWEN3_30B_A3B
from wisp.models.random_checkpoint import write_random_checkpoint


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--modes", default="paged:16,resident", help="comma list of mode[:cap]")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="sampling keeps a random model from looping on one token (which would fake a high hit rate)")
    ap.add_argument("--moe-backend", default="torch", choices=["torch", "triton"])
    ap.add_argument("--workdir", default="/tmp/wisp-bench-ckpt")
    ap.add_argument("--keep", action="store_true", help="keep the written checkpoint")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    path = Path(args.workdir)
    if not (path / "config.json").is_file():
        t0 = time.perf_counter()
        write_random_checkpoint(dict(QWEN3_30B_A3B, num_hidden_layers=args.layers), path, seed=0, device="cuda")
        print(f"wrote {args.layers}-layer checkpoint in {time.perf_counter() - t0:.1f} s", flush=True)
    modes = [m.partition(":") for m in args.modes.split(",")]
    caps = ",".join(c for m, _, c in modes if m == "paged" and c)
    bench_decode(argparse.Namespace(
        model=str(path), load_format="safetensors", mode=",".join(dict.fromkeys(m for m, _, _ in modes)),
        expert_cap=caps or None, prompt_len=args.prompt_len, decode_tokens=args.decode_tokens,
        temperature=args.temperature, device="cuda", dtype="bfloat16", moe_backend=args.moe_backend, out=args.out,
    ))
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
