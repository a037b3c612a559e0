"""`wisp bench llama-cpp pair`: a paired run's records (wisp, llama.cpp, wisp again on one GPU machine) as rows
of the paired results file.

    wisp bench llama-cpp pair --out-dir gpu-out                                          # print the comparison
    wisp bench llama-cpp pair --out-dir gpu-out --host M --commit 2bf4d35 \
        --append benchmarks/results/peer_llama_cpp_olmoe_1b_7b_paired.json                # and keep it

Reads what `STAGE=paired bash benchmarks/recipes/gpu_llama_cpp.sh` leaves in its output folder: our decode and
prefill records before and after llama.cpp (`decode_hybrid_c0_{before,after}.json`, `prefill_...`), the memory
sampler's peak for each (`smi_*.json`) and llama.cpp's record (`llama_cpp_<model>_<type>.json`, from
`wisp bench llama-cpp run`).
Prints, per wisp run: decode tok/s and its ratio to llama.cpp's (sampled, and unsampled where `run` timed
it), the median step's ratio, the cold TTFT at 2048 tokens and its ratio, the peaks against llama.cpp's, and
where a CPU-helped layer's time went. `--append` adds one llama.cpp row and one row per wisp run to the file;
`--commit` is the code that ran (the GPU machine's checkout does not know it) and `--host` names the machine.
"""

from __future__ import annotations

import json
from pathlib import Path

from wisp.bench.llama_cpp.compare import ratio
from wisp.errors import WispError

RUNS = ("before", "after")
ROUTING = "decode: approx-layer0:olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl; TTFT: random-router"


def _json(path: Path):
    """A record file of the stage; a missing one is bad input (one WispError line)."""
    if not path.is_file():
        raise WispError(f"{path}: missing (not the output folder of a whole paired stage?)")
    return json.loads(path.read_text())


def peer_record(out: Path) -> dict:
    found = sorted(out.glob("llama_cpp_*.json"))
    if len(found) != 1:
        raise WispError(f"{out}: expected one llama_cpp_*.json (`wisp bench llama-cpp run`'s record), "
                        f"found {len(found)}")
    record = _json(found[0])
    return record[0] if isinstance(record, list) else record


def wisp_run(out: Path, run: str) -> dict:
    """One wisp run's decode record, its prefill records by prompt length, and its two peaks."""
    decode = _json(out / f"decode_hybrid_c0_{run}.json")[0]
    prefill = {r["prompt_len"]: r for r in _json(out / f"prefill_hybrid_c0_{run}.json")}
    smi = {kind: _json(out / f"smi_{kind}_hybrid_c0_{run}.json") for kind in ("decode", "prefill")}
    return {"decode": decode, "prefill": prefill, "peaks": {kind: s["peak_gpu_bytes"] for kind, s in smi.items()},
            "sampler": smi["decode"].get("sampler")}


def rows(out: Path, host: str, commit: str, mode: str) -> list[dict]:
    """llama.cpp's row, then one per wisp run, in the paired file's fields."""
    peer = peer_record(out)
    ttft = peer["ttft_s"]
    budget = peer["peak_gpu_bytes"]
    common = {"placement": peer["placement"], "preset": peer["preset"], "gpu": peer["gpu"],
              "vram_budget_nvidia_smi": budget}
    result = [{**common, "system": "llama.cpp", "mode": peer["placement_flags"], "expert_cap": None,
               "routing": "any (CPU experts cost the same whatever the routing)", "weights": peer["weights"],
               "llama_cpp_commit": peer["llama_cpp_commit"], "command": peer["command"], "host": host,
               "decode_tok_s": peer["decode_tok_s"], "decode_tok_s_unsampled": peer.get("decode_tok_s_unsampled"),
               "command_unsampled": peer.get("command_unsampled"),
               "ttft_512_s": ttft.get("512"), "ttft_2048_s": ttft.get("2048"), "peak_gpu_bytes_decode": budget,
               "peak_gpu_bytes_prefill": budget, "within_budget": True}]
    for run in RUNS:
        w = wisp_run(out, run)
        d, pre, peaks = w["decode"], w["prefill"], w["peaks"]
        totals = d["hybrid_cpu_steps"]
        layers = max(totals["steps"], 1)
        helped_step_s = d["hybrid_step_kinds"]["1"].get("eager")
        within = None if None in peaks.values() or budget is None else max(peaks.values()) <= budget
        result.append({
            **common, "system": "wisp", "expert_cap": d["expert_cap"], "routing": ROUTING, "host": host,
            "run": f"{run} llama.cpp", "mode": mode, "decode_tok_s": d["decode_tok_s"], "step_s": d["step_s"],
            "step_s_median": d.get("step_s_median"), "step_s_p90": d.get("step_s_p90"), "step_s_max": d.get("step_s_max"),
            "split_step_median_s": helped_step_s, "graph_step_median_s": d["hybrid_step_kinds"]["1"].get("graph"),
            "split_steps": d["piece_steps"], "graph_steps": d["graph_steps"],
            "cpu_experts_per_layer": round(totals["cpu_ranks"] / layers, 2),
            "per_cpu_layer_ms": {name: round(1e3 * totals[key] / layers, 3) for name, key in
                                 (("kernel", "kernel_s"), ("routing_wait", "routing_wait_s"),
                                  ("gpu_wait", "gpu_wait_s"), ("gpu_pairs_device_timed", "gpu_s"))},
            "ttft_512_s": pre[512]["ttft_s"], "ttft_2048_s": pre[2048]["ttft_s"],
            "prefill_chunk_tokens": pre[2048].get("max_num_batched_tokens", 512),
            "peak_gpu_bytes_decode": peaks["decode"], "peak_gpu_bytes_prefill": peaks["prefill"],
            "within_budget": within, "memory_sampler": w["sampler"],
            "decode_vs_llama_cpp": ratio(d["decode_tok_s"], peer["decode_tok_s"], True, 3),
            "decode_vs_llama_cpp_unsampled": ratio(d["decode_tok_s"], peer.get("decode_tok_s_unsampled"), True, 3),
            "split_step_vs_llama_cpp": ratio(1 / helped_step_s if helped_step_s else None, peer["decode_tok_s"], True, 3),
            "ttft_2048_vs_llama_cpp": ratio(pre[2048]["ttft_s"], ttft.get("2048"), False, 3),
            "h2d_gbps_probe": d["h2d_gbps_probe"], "commit": commit, "command": d["command"],
            "cpu_and_link_factors_at_end": [d["hybrid_cpu_factor"], d["hybrid_link_factor"]],
        })
    return result


def show(records: list[dict]) -> None:
    peer = records[0]
    print(f"llama.cpp {peer['mode']}: {peer['decode_tok_s']} tok/s (unsampled {peer['decode_tok_s_unsampled']}), "
          f"TTFT 2048 {peer['ttft_2048_s']} s, {peer['peak_gpu_bytes_decode']} B")
    for r in records[1:]:
        ms = r["per_cpu_layer_ms"]
        print(f"wisp {r['run']}: {r['decode_tok_s']} tok/s ({r['decode_vs_llama_cpp']}x; unsampled "
              f"{r['decode_vs_llama_cpp_unsampled']}x), median step {r['step_s_median']} s, split step "
              f"{r['split_step_vs_llama_cpp']}x; TTFT 2048 {r['ttft_2048_s']} s ({r['ttft_2048_vs_llama_cpp']}x); "
              f"peaks {r['peak_gpu_bytes_decode']} / {r['peak_gpu_bytes_prefill']} B (within: {r['within_budget']}); "
              f"{r['cpu_experts_per_layer']} CPU experts a layer, CPU side {ms['kernel']} ms, GPU pairs "
              f"{ms['gpu_pairs_device_timed']} ms")


def bench_pair(args) -> list[dict]:
    """`wisp bench llama-cpp pair`: the rows, printed, and appended to `--append` when given."""
    out = Path(args.out_dir)
    peer_record(out)  # the llama.cpp run first: without it there is nothing to pair
    commit = args.commit or wisp_run(out, RUNS[0])["decode"].get("commit")
    records = rows(out, args.host, commit, args.mode)
    show(records)
    if args.append:
        path = Path(args.append)
        kept = _json(path) if path.is_file() else []
        path.write_text(json.dumps(kept + records, indent=1) + "\n")
        print(f"{len(records)} rows added to {path}")
    return records
