"""BENCHMARKS.md, regenerated from the JSON records kept under benchmarks/results/.

    python -m wisp.bench.report [--results benchmarks/results] [--out BENCHMARKS.md]

Every record of every file becomes one table row (a file holds one record or a list); fields a record
lacks (older result files) show as "-". The page is a pure function of the files: never edit it by hand.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = [
    ("mode", "mode", "{}"),
    ("expert_cap", "cap", "{}"),
    ("backends", "moe / attention", "{}"),
    ("graphs", "CUDA graphs", "{}"),
    ("routing", "routing", "{}"),
    ("decode_tok_s", "decode tok/s", "{:.2f}"),
    ("step_s", "step ms", "ms"),
    ("roofline_step_s", "roofline ms", "ms"),
    ("ttft_s", "TTFT s", "{:.3f}"),
    ("hit_rate", "hit rate", "{:.3f}"),
    ("bytes_h2d_per_token", "MB/token", "MB"),
    ("h2d_gbps_probe", "probe GB/s", "{:.1f}"),
    ("peak", "peak GPU GB", "GB"),
]
DECODE_COLUMNS = COLUMNS[:2] + [("batch", "batch", "{}")] + COLUMNS[2:]
SERVE_COLUMNS = [  # `wisp bench serve` records: one per (concurrency or rate, load control setting)
    ("setting", "setting", "{}"),
    ("load_control", "load control", "{}"),
    ("expert_cap", "cap", "{}"),
    ("concurrency", "W", "{}"),
    ("max_concurrency", "max running", "{}"),
    ("decode_tok_s", "aggregate tok/s", "{:.1f}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("itl_p50_s", "ITL p50 ms", "ms"),
    ("itl_p99_s", "ITL p99 ms", "ms"),
    ("decode_width_mean", "decode width", "{:.2f}"),
    ("hit_rate", "hit rate", "{:.3f}"),
    ("h2d_gbps_probe", "probe GB/s", "{:.1f}"),
]
PREFILL_COLUMNS = [  # `wisp bench prefill` records: one per (run, prompt length)
    ("mode", "mode", "{}"),
    ("expert_cap", "cap", "{}"),
    ("prompt_len", "prompt", "{}"),
    ("prefill_steps", "steps", "{}"),
    ("ttft_s", "TTFT s", "{:.3f}"),
    ("bound_s", "bound s", "{:.3f}"),
    ("ttft_over_bound", "TTFT / bound", "{:.2f}"),
    ("expert_loads_per_layer", "loads / layer", "{:.1f}"),
    ("distinct_missing", "distinct missing", "{}"),
    ("bytes_h2d", "GB host->GPU", "GB"),
    ("h2d_gbps_probe", "probe GB/s", "{:.1f}"),
]
GRAMMAR_COLUMNS = [  # benchmarks/probes/grammar_mask_cost.py: per engine, grammar and batch, microseconds a decode step
    ("grammar_engine", "engine", "{}"),
    ("grammar", "grammar", "{}"),
    ("batch", "batch", "{}"),
    ("allowed_share", "allowed", "{:.2f}"),
    ("mask_us_mean", "mask us mean", "{:.0f}"),
    ("mask_us_p99", "mask us p99", "{:.0f}"),
    ("apply_us_mean", "apply us mean", "{:.0f}"),
    ("advance_us_mean", "advance us mean", "{:.0f}"),
    ("total_us_mean", "total us mean", "{:.0f}"),
    ("total_us_p99", "total us p99", "{:.0f}"),
    ("compile_cold_ms", "compile cold ms", "{:.1f}"),
]
PEER_COLUMNS = [  # `wisp bench llama-cpp compare` records: llama.cpp and wisp at each llama.cpp expert placement
    ("system", "system", "{}"),
    ("placement", "placement", "{}"),
    ("mode", "mode / flags", "{}"),
    ("expert_cap", "cap", "{}"),
    ("routing", "routing", "{}"),
    ("decode_tok_s", "decode tok/s", "{:.2f}"),
    ("ttft_512_s", "TTFT 512 s", "{:.3f}"),
    ("ttft_2048_s", "TTFT 2048 s", "{:.3f}"),
    ("prefill_chunk_tokens", "prefill chunk", "{}"),
    ("peak_gpu_bytes_decode", "nvidia-smi GB decode", "GB"),
    ("peak_gpu_bytes_prefill", "nvidia-smi GB prefill", "GB"),
    ("within_budget", "within llama.cpp's GB", "yes/no"),
    ("decode_vs_llama_cpp", "decode vs llama.cpp", "{:.2f}x"),
    ("ttft_2048_vs_llama_cpp", "TTFT 2048 vs llama.cpp", "{:.2f}x"),
]
AGENT_COLUMNS = [  # `wisp bench agent` records: one per allocator arm
    ("arm", "arm", "{}"),
    ("expert_cap", "cap", "{}"),
    ("kv_blocks", "KV blocks", "{}"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}"),
    ("ttft_p90_s", "TTFT p90 s", "{:.3f}"),
    ("decode_tok_s", "decode tok/s", "{:.2f}"),
    ("turn_wall_p50_s", "turn p50 s", "{:.2f}"),
    ("turn_wall_p90_s", "turn p90 s", "{:.2f}"),
    ("e2e_wall_s", "end to end s", "{:.1f}"),
    ("hit_rate", "hit rate", "{:.3f}"),
    ("preemptions", "preemptions", "{}"),
    ("resizes", "resizes", "{}"),
    ("bytes_h2d", "GB host->GPU", "GB"),
    ("peak", "peak GPU GB", "GB"),
]


def _cell(record: dict, key: str, fmt: str) -> str:
    if key == "backends":
        on_gpu = record.get("gpu", "cpu") != "cpu"
        names = [record.get(f"{k}_backend", "torch") for k in ("moe", "attention")]
        names = [("triton" if on_gpu else "torch") if n == "auto" else n for n in names]  # what auto resolved to
        return " / ".join(names) if record.get("mode") != "accelerate" else "transformers + accelerate"
    if key == "graphs":
        return "-" if "graph_steps" not in record else ("yes" if record["graph_steps"] else "no")
    if key == "batch":
        return str(record.get("batch", 1))
    if key == "resizes":
        return "-" if "resizes" not in record else str(len(record["resizes"]))
    if key == "ttft_s" and "prefill_tokens" not in record and record.get("mode") != "accelerate":
        return "-"  # older records: the warm-up used the same prompt, so it came from the prefix cache
    value = record.get("peak_gpu_bytes", record.get("peak_gpu_bytes_decode")) if key == "peak" else record.get(key)
    if value is None:
        return "-"
    if fmt == "yes/no":
        return "yes" if value else "no"
    if fmt == "ms":
        return f"{value * 1e3:.1f}"
    if fmt == "MB":
        return f"{value / 1e6:.1f}"
    if fmt == "GB":
        return f"{value / 1e9:.2f}"
    return fmt.format(value)


def load_records(results: Path) -> list[tuple[str, dict]]:
    rows = []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        for record in data if isinstance(data, list) else [data]:
            rows.append((path.name, record))
    return rows


def render(rows: list[tuple[str, dict]]) -> str:
    out = ["# Benchmarks", "", "Generated by `python -m wisp.bench.report` from `benchmarks/results/*.json`; do not edit.", "",
           "TTFT is the time to the first token of a prompt none of which is in the prefix cache. Records made before",
           "`wisp bench` recorded `prefill_tokens` warmed up on the same prompt, so their timed prompt came from the",
           "prefix cache: their TTFT is left out (-); the JSON keeps the raw figure.", ""]
    by_file: dict[str, list[dict]] = {}
    for name, record in rows:
        by_file.setdefault(name, []).append(record)
    for name, records in by_file.items():
        first = records[0]
        what = first.get("preset") or "a checkpoint"
        layers = first.get("layers")
        out.append(f"## {name}")
        out.append("")
        prefill, agent, peer, serve = "prefill_steps" in first, "arm" in first, "system" in first, "loop" in first
        grammar = "grammar_engine" in first
        columns = (GRAMMAR_COLUMNS if grammar else PEER_COLUMNS if peer else AGENT_COLUMNS if agent else
                   PREFILL_COLUMNS if prefill else SERVE_COLUMNS if serve else DECODE_COLUMNS)
        shape = (f"cold prompts, {first.get('max_num_batched_tokens', '-')} tokens per step" if prefill else
                 f"prompt {first.get('prompt_len', '-')} tokens, {first.get('decode_tokens', '-')} decode tokens")
        if serve:
            what = first.get("model", what)
            shape = (f"{first['loop']} loop, prompt {first['prompt_len']} tokens, {first['output_len']} output tokens, "
                     f"routing {first.get('routing', '-')}")
        if grammar:
            shape = (f"constrained decoding's token mask at a {first['vocab_size']:,}-token vocabulary, per decode step "
                     f"of the batch's matchers together, a random walk of {first['tokens']} tokens")
        if peer:
            shape = "batch-1 decode and cold TTFT at each of llama.cpp's expert placements, at its GPU footprint there"
        if agent:
            what = first.get("model", what)
            width = (f"in phases of W:N sessions {first['phases']}" if "phases" in first else
                     f"at concurrency {first['concurrency']}")
            shape = (f"{first['sessions']} agent sessions ({', '.join(first['workload'])}) {width}, "
                     f"budget {first['vram_budget'] / 2**30:.0f} GiB, routing {first['routing']}")
        out.append(f"Model: {what}{f' ({layers} layers)' if layers else ''}; GPU: {first.get('gpu', '-')}; {shape}.")
        if first.get("note"):
            out.append(f"Note: {first['note']}.")
        if first.get("command"):
            out.append(f"Command: `{first['command']}`")
        out.append("")
        out.append("| " + " | ".join(title for _, title, _ in columns) + " |")
        out.append("|" + "---|" * len(columns))
        for record in records:
            out.append("| " + " | ".join(_cell(record, key, fmt) for key, _, fmt in columns) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="regenerate BENCHMARKS.md from benchmarks/results/*.json")
    ap.add_argument("--results", default="benchmarks/results")
    ap.add_argument("--out", default="BENCHMARKS.md")
    args = ap.parse_args(argv)
    Path(args.out).write_text(render(load_records(Path(args.results))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
