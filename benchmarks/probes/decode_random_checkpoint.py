"""Question: what does batch-1 decode give on a random checkpoint *written to disk* in a real model's shapes
(default: Qwen3-30B-A3B), so that loading goes through safetensors exactly as a user's checkpoint does? The
measuring itself is `wisp bench decode`.

Asked: 2026-11-29.

Answer (BENCHMARKS.md, decode_qwen3_30b_a3b_24layers_torch.json: 24 layers, torch kernels, one H200): paged
C = 16 6.64 tok/s (hit rate 0.848), C = 32 7.18 (0.946), resident 6.67, offload 1.55 (29 GB over the link a
token). It loads and decodes like a user's checkpoint; later runs use `wisp bench decode --load-format dummy`
(random weights made on the device, equal to a written checkpoint: tests/test_bench_cli.py).

    python benchmarks/probes/decode_random_checkpoint.py --layers 24 --modes paged:16,resident,offload \
        --prompt-len 32 --decode-tokens 64 --out results.json

Random weights route more consistently than a trained model, so hit rates here flatter real traffic.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from wisp.cli import main as wisp
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
    wisp(["bench", "decode", "--model", str(path), "--load-format", "safetensors",
          "--mode", ",".join(dict.fromkeys(m for m, _, _ in modes)), *(["--expert-cap", caps] if caps else []),
          "--prompt-len", str(args.prompt_len), "--decode-tokens", str(args.decode_tokens),
          "--temperature", str(args.temperature), "--device", "cuda", "--dtype", "bfloat16",
          "--moe-backend", args.moe_backend, "--attention-backend", "torch",  # as the rows it answered with ran
          *(["--out", args.out] if args.out else [])])
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
