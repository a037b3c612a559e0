"""`wisp bench llama-cpp run`: llama.cpp in wisp's harness, llama-bench at each expert placement, as wisp
benchmark records.

    wisp bench llama-cpp run --llama-bench .llama_cpp/build-cuda/bin/llama-bench --gguf /tmp/olmoe.gguf \
        --model olmoe-1b-7b --placements all-cpu,half,all-gpu --prompts 512,2048 --decode-tokens 64 --out FILE.json

Placements (llama.cpp keeps attention, norms and embeddings on the GPU with -ngl 99 in all three):
- all-cpu: every layer's experts on the CPU (`--n-cpu-moe` = the layer count), the issue's reference VRAM;
- half: the experts of the first half of the layers on the CPU;
- all-gpu: everything on the GPU (its resident speed).
For each, llama-bench runs the prompt lengths (`-p`, prompt processing: TTFT = tokens / its tokens per second,
cold: llama-bench clears the KV cache between runs) and a decode of `--decode-tokens` (`-n`), `--repetitions`
times, with `-o json`. The GPU's peak memory is sampled every 100 ms while each placement runs (`gpu_peak`:
NVML, nvidia-smi's count); `--unsampled-decode` times the decode again with nothing sampling
(`decode_tok_s_unsampled`: the earlier sampler, nvidia-smi started every 100 ms, slowed decodes;
`wisp bench llama-cpp sampler-cost` measures a sampler's cost to wisp).
Each record: peer "llama.cpp", the llama.cpp commit (.llama_cpp/COMMIT), the exact command, decode_tok_s,
ttft_s per prompt length, peak_gpu_bytes, the placement and its flags. Random weights: llama.cpp's CPU experts
cost the same whatever the routing, while wisp's paged mode depends on it (compare with replayed real routing).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

from wisp.bench.llama_cpp.gpu_peak import PeakGpuMemory
from wisp.config import ModelConfig
from wisp.errors import WispError
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset

PLACEMENTS = ("all-cpu", "half", "all-gpu")
COMMIT_FILE = Path(".llama_cpp") / "COMMIT"  # where benchmarks/recipes/llama_cpp/fetch.sh leaves it


def placement_flags(name: str, layers: int) -> list[str]:
    if name not in PLACEMENTS:
        raise WispError(f"unknown placement {name!r}; choose from {', '.join(PLACEMENTS)}")
    cpu_layers = {"all-cpu": layers, "half": layers // 2, "all-gpu": 0}[name]
    return ["-ngl", "99", "-ncmoe", str(cpu_layers)]


def run_placement(args, placement: str, cfg: ModelConfig) -> dict:
    flags = placement_flags(placement, cfg.num_layers)
    cmd = bench_command(args, args.prompts, flags)
    start = time.perf_counter()
    with PeakGpuMemory() as memory:
        tests = llama_bench(cmd)
    decode = [t for t in tests if t["n_gen"] > 0 and t["n_prompt"] == 0]
    prompts = [t for t in tests if t["n_prompt"] > 0 and t["n_gen"] == 0]
    unsampled = {}
    if args.unsampled_decode:
        quiet = bench_command(args, "0", flags)  # the decode alone
        rates = [t["avg_ts"] for t in llama_bench(quiet) if t["n_gen"] > 0 and t["n_prompt"] == 0]
        unsampled = {"decode_tok_s_unsampled": round(rates[0], 3) if rates else None,
                     "command_unsampled": " ".join(shlex.quote(c) for c in quiet)}
    return {
        "peer": "llama.cpp", "llama_cpp_commit": args.commit, "mode": f"llama.cpp {placement}",
        "placement": placement, "placement_flags": " ".join(flags), "preset": args.model,
        "layers": cfg.num_layers, "batch": 1, "decode_tokens": args.decode_tokens,
        "decode_tok_s": round(decode[0]["avg_ts"], 3) if decode else None,
        "ttft_s": {str(t["n_prompt"]): round(t["n_prompt"] / t["avg_ts"], 4) for t in prompts},
        "prompt_tok_s": {str(t["n_prompt"]): round(t["avg_ts"], 1) for t in prompts},
        "peak_gpu_bytes": memory.peak, "weights": tests[0]["model_type"] if tests else None,
        "model_size_bytes": tests[0]["model_size"] if tests else None, "gpu": tests[0]["gpu_info"] if tests else None,
        "n_threads": tests[0]["n_threads"] if tests else None, "routing": "llama.cpp's own (random weights)",
        "wall_s": round(time.perf_counter() - start, 1), "command": " ".join(shlex.quote(c) for c in cmd), **unsampled,
    }


def bench_command(args, prompts: str, flags: list[str]) -> list[str]:
    """The llama-bench command line for these prompt lengths (`-p`) and placement flags."""
    return [args.llama_bench, "-m", args.gguf, "-p", prompts, "-n", str(args.decode_tokens), "-r", str(args.repetitions),
            "-o", "json", *flags, *shlex.split(args.extra)]


def llama_bench(cmd: list[str]) -> list[dict]:
    """llama-bench's JSON tests; a failure is one WispError line."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise WispError(f"cannot run llama-bench {cmd[0]}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise WispError(f"llama-bench failed ({proc.returncode}): {last}")
    return json.loads(proc.stdout)


def bench_llama_cpp(args) -> list[dict]:
    """`wisp bench llama-cpp run`: one record per placement, printed as it comes and written to `--out`."""
    args.commit = args.commit or (COMMIT_FILE.read_text().strip() if COMMIT_FILE.is_file() else "unknown")
    cfg = model_config(json.loads(Path(args.model).read_text()) if Path(args.model).is_file() else preset(args.model))
    for placement in args.placements.split(","):
        placement_flags(placement, cfg.num_layers)  # every name checked before the first (long) run
    records = []
    for placement in args.placements.split(","):
        record = run_placement(args, placement, cfg)
        print(f"{record['mode']:<22} decode {record['decode_tok_s']} tok/s  TTFT {record['ttft_s']}  "
              f"peak GPU {record['peak_gpu_bytes']}", flush=True)
        records.append(record)
    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")
    return records
