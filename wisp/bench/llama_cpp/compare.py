"""`wisp bench llama-cpp compare`: llama.cpp against wisp at each of llama.cpp's expert placements, one
comparison file per model.

    wisp bench llama-cpp compare --peer benchmarks/results/llama_cpp/llama_cpp_olmoe_1b_7b_bf16.json \
        --decode benchmarks/results/llama_cpp/wisp_decode_olmoe_1b_7b.json [--decode ...] \
        --prefill benchmarks/results/llama_cpp/wisp_prefill_olmoe_1b_7b.json [--prefill ...] \
        --note "..." --out benchmarks/results/peer_llama_cpp_olmoe_1b_7b.json

Inputs are the records `benchmarks/recipes/gpu_llama_cpp.sh` writes: llama.cpp's (`wisp bench llama-cpp run`)
and ours (`wisp bench decode` / `prefill`, each tagged with the placement whose nvidia-smi footprint sized it). One row per
llama.cpp placement, then one per (placement, our mode, prefill chunk): decode tok/s, cold TTFT at 512 and
2048 tokens (with the random router: `wisp bench prefill` replays no trace), the nvidia-smi peaks (decode,
prefill), whether they stayed within llama.cpp's (null without a peak), and our
speed over llama.cpp's at that placement (above 1: we are faster). BENCHMARKS.md renders the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from wisp.errors import WispError


def _load(path: str) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise WispError(f"cannot read the records {path}: {exc}") from None
    return data if isinstance(data, list) else [data]


def ratio(ours: float | None, theirs: float | None, higher_is_better: bool, digits: int = 2) -> float | None:
    """Our figure over theirs where higher is better (tok/s), theirs over ours where lower is (seconds):
    above 1, we are better; None where either is missing."""
    if not ours or not theirs:
        return None
    return round(ours / theirs if higher_is_better else theirs / ours, digits)


def compare(peer: list[dict], decode: list[dict], prefill: list[dict]) -> list[dict]:
    rows, theirs = [], {}
    for p in peer:
        theirs[p["placement"]] = p
        rows.append({"system": "llama.cpp", "placement": p["placement"], "mode": p["placement_flags"], "expert_cap": None,
                     "weights": p["weights"], "routing": "any (CPU experts cost the same whatever the routing)",
                     "decode_tok_s": p["decode_tok_s"], "ttft_512_s": p["ttft_s"].get("512"),
                     "ttft_2048_s": p["ttft_s"].get("2048"), "peak_gpu_bytes_decode": p["peak_gpu_bytes"],
                     "peak_gpu_bytes_prefill": p["peak_gpu_bytes"], "vram_budget_nvidia_smi": p["peak_gpu_bytes"],
                     "within_budget": True, "gpu": p["gpu"],
                     "command": p["command"], "preset": p["preset"]})
    for placement, p in theirs.items():
        groups: dict[tuple, dict[str, dict]] = {}  # (mode, cap, hot, chunk) -> prompt length -> prefill record
        for r in prefill:
            if r["placement"] == placement:
                groups.setdefault((*_run_of(r), r.get("max_num_batched_tokens")), {})[str(r["prompt_len"])] = r
        runs = []  # (decode record or None, prefill records by length): a decode run takes its mode's widest chunk
        for d in (r for r in decode if r["placement"] == placement):
            same = sorted((k for k in groups if k[:3] == _run_of(d)), key=lambda k: k[3] or 0)
            runs.append((d, groups.pop(same[-1]) if same else {}))
        runs += [(None, pre) for pre in groups.values()]
        for d, pre in runs:
            rows.append(_our_row(placement, p, d, pre))
    return rows


def _hot(n: int) -> str:
    return f"{n} hot expert{'' if n == 1 else 's'}"


def _run_of(record: dict) -> tuple:
    """What makes two of our records one configuration: the mode, its cap, its hot experts a layer."""
    return record["mode"], record["expert_cap"], record.get("hot_experts", 0)


def _our_row(placement: str, theirs: dict, d: dict | None, pre: dict[str, dict]) -> dict:
    first = next(iter(pre.values()), None)
    some = d or first
    budget = some["vram_budget_nvidia_smi"]
    peak_d = d["peak_gpu_bytes_nvidia_smi"] if d else None
    peak_p = first["peak_gpu_bytes_nvidia_smi"] if first else None
    ttft = {n: pre[n]["ttft_s"] if n in pre else None for n in ("512", "2048")}
    peaks = [b for b in (peak_d, peak_p) if b is not None]
    routing = [f"decode: {d.get('routing', 'router')}"] if d else []
    routing += ["TTFT: random-router"] if pre else []  # `wisp bench prefill` replays no trace
    return {
        "system": "wisp", "placement": placement, "expert_cap": some["expert_cap"],
        "mode": some["mode"] + (f" ({_hot(some['hot_experts'])} a layer)" if some.get("hot_experts") else "")
        + (" (eager)" if "--enforce-eager" in some.get("command", "") else ""),
        "prefill_chunk_tokens": first.get("max_num_batched_tokens") if first else None, "weights": some.get("preset"),
        "routing": "; ".join(routing), "decode_tok_s": d["decode_tok_s"] if d else None,
        "ttft_512_s": ttft["512"], "ttft_2048_s": ttft["2048"], "peak_gpu_bytes_decode": peak_d,
        "peak_gpu_bytes_prefill": peak_p, "vram_budget_nvidia_smi": budget,
        "within_budget": all(b <= budget for b in peaks) if peaks else None,
        "decode_vs_llama_cpp": ratio(d["decode_tok_s"] if d else None, theirs["decode_tok_s"], True),
        "ttft_2048_vs_llama_cpp": ratio(ttft["2048"], theirs["ttft_s"].get("2048"), False),
        "gpu": some.get("gpu"), "commit": some.get("commit"), "preset": some.get("preset"),
        "command": "; ".join(x["command"] for x in (d, first) if x is not None)}


def bench_compare(args) -> list[dict]:
    """`wisp bench llama-cpp compare`: the rows, written to `--out` and printed one a line."""
    rows = compare(_load(args.peer), [r for f in args.decode for r in _load(f)], [r for f in args.prefill for r in _load(f)])
    if args.note:
        rows[0]["note"] = args.note
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    for r in rows:
        print(f"{r['system']:9} {r['placement']:8} {str(r['mode']):18} {str(r['expert_cap']):>4} "
              f"{r['decode_tok_s']} tok/s  TTFT {r['ttft_512_s']} / {r['ttft_2048_s']}  within {r['within_budget']}")
    return rows
