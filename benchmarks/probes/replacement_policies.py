"""Question: does a replacement policy other than LRU (LFU, LRFU, ARC; OPT and static pinning as bounds) give
the expert cache a better hit rate on the real routing traces?

Asked: 2026-12-01.

Answer (docs/replacement_policies.md; benchmarks/results/logs/replacement_policies.json): LRFU with
lambda = 0.03 beats LRU at every capacity on every trace, by +1.0 to +2.5 hit-rate points on Mixtral, +1.2 to
+5.3 on FLAME-MoE-290M, +2.5 to +7.1 on OLMoE layer 0 and +0.4 to +1.2 on Qwen1.5 layer 0; LFU is close
behind, ARC is LRU in practice (within 0.14 points on Mixtral), and OPT sits 4.4 to 29.1 points above LRU.
Not adopted in the pager: the rule is a win on the GPU too, and none was run.

The method: the expert-cache hit rate of lru / lfu / lrfu / arc / opt / static per trace and capacity, each
trace replayed by `wisp sim` (in process), plus each layer's own rate from `wisp.sim.policies.miss_table`.
CPU only, no subsampling (the whole run takes about 75 s on 2 cores).

Traces (../shared/data, see its README): Mixtral-8x7B decode, HumanEval and GSM8K (32 layers, top-2 of 8);
FLAME-MoE-290M teacher-forced (8 layers, top-6 of 64); OLMoE-1B-7B layer 0 (top-8 of 64) and
Qwen1.5-MoE-A2.7B layer 0 (top-4 of 60). Every token is its own step (`wisp sim --per-token`, the batch-1
decode view the planner prices): only the Qwen log has a step column, whose batched passes route to up
to 57 of its 60 experts, so every demand policy would be out of its domain below C = 57.

Hit rate = 1 - misses / references with both summed over the trace's layers (what `wisp sim` prints),
i.e. the reference-weighted mean of the per-layer hit rates; the layers of a trace have equal reference
counts except Mixtral's, where 52 of 18,720 (token, layer) cells are missing. The JSON also keeps every
layer's rate and their plain mean.

LRFU's lambda: `--sweep` replays the Mixtral HumanEval trace (and only it) under lambda in SWEEP_DECAYS
and records the pooled hit rate per capacity; the others are held out from that choice.

    python benchmarks/probes/replacement_policies.py [--data ../shared/data] [--sweep]
        [--out benchmarks/results/logs/replacement_policies.json]
        [--plot benchmarks/results/logs/replacement_policies.png]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from wisp.cli import main as wisp
from wisp.plan.plots import pyplot
from wisp.sim.commands import one_step_per_token
from wisp.sim.policies import LRFU_DECAY_PER_STEP, OUT_OF_DOMAIN, POLICIES, lrfu_misses, miss_table
from wisp.trace.readers import load_any

SHOWN = ("lru", "lfu", "lrfu", "arc", "opt", "static")  # the table's order
CAPS_64 = [8, 12, 16, 24, 32, 48]
TRACES = {  # name -> (path under --data, capacities)
    "mixtral-humaneval": ("routing_mixtral8x7b/humaneval_2_decode_TxLxK.npz", [2, 3, 4, 5, 6, 7]),
    "mixtral-gsm8k": ("routing_mixtral8x7b/gsm8k_2_decode_TxLxK.npz", [2, 3, 4, 5, 6, 7]),
    "flame-290m": ("flame_moe_290m_dynande/flame290m_iter5473_32seq_x64tok_TxLxK.npz", CAPS_64),
    "olmoe-layer0": ("layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl", CAPS_64),
    "qwen15-layer0": ("layer0_only_vllm_logs/qwen15moe_a27b_layer0_gsm8k_TotaniYash.jsonl", [4, 8, 12, 16, 24, 32, 48]),
}
SWEEP_TRACE = "mixtral-humaneval"
SWEEP_DECAYS = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 64.0]  # 0 = LFU, 64 = LRU (see wisp.sim.policies)


def hit_rates(misses: list[int], refs: int) -> list[float | None]:
    return [None if m == OUT_OF_DOMAIN else round(1 - m / refs, 4) for m in misses]


def mean_per_cap(rows: list[list[float | None]]) -> list[float | None]:
    """The plain mean over layers of each capacity's hit rate (None where any layer is out of domain)."""
    return [None if None in column else round(float(np.mean(column)), 4) for column in zip(*rows)]


def replay(name: str, path: Path, caps: list[int], tmp: str) -> dict:
    """`wisp sim` on one trace (pooled over layers), then each layer's own hit rates."""
    argv = ["sim", "--trace", str(path), "--policies", ",".join(POLICIES), "--caps", ",".join(map(str, caps)),
            "--per-token"]
    print(f"\n== {name}: wisp {' '.join(argv)}", flush=True)
    started = time.perf_counter()
    wisp([*argv, "--json", f"{tmp}/{name}.json"])
    sim = json.loads(Path(f"{tmp}/{name}.json").read_text())
    trace = one_step_per_token(load_any(path))
    per_layer: dict[str, list[list[float | None]]] = {p: [] for p in POLICIES}
    for layer in trace.layers.tolist():
        steps = trace.steps(layer)
        table = miss_table(steps, caps, POLICIES)
        refs = sum(len(s) for s in steps)
        for p in POLICIES:
            per_layer[p].append(hit_rates(table[p].tolist(), refs))
    return {
        "trace": str(path.name), "layers": trace.layers.tolist(), "experts": trace.num_experts, "top_k": trace.top_k,
        "tokens": trace.num_tokens, "references": sim["references"], "caps": caps,
        "command": "wisp " + " ".join(argv),
        "hit_rate": {p: hit_rates(sim["misses"][p], sim["references"]) for p in POLICIES},
        "misses": sim["misses"],
        "per_layer_hit_rate": per_layer,
        "mean_of_layer_hit_rates": {p: mean_per_cap(rows) for p, rows in per_layer.items()},
        "layers_beating_lru": {p: [sum(r[i] is not None and r[i] > lru[i] for r, lru in zip(rows, per_layer["lru"]))
                                   for i in range(len(caps))] for p, rows in per_layer.items()},
        "seconds": round(time.perf_counter() - started, 1),
    }


def sweep_decay(path: Path, caps: list[int]) -> dict:
    """LRFU's pooled hit rate per lambda and capacity on one trace."""
    trace = load_any(path)
    steps = [trace.steps(layer) for layer in trace.layers.tolist()]
    refs = sum(len(s) for layer in steps for s in layer)
    out = {}
    for decay in SWEEP_DECAYS:
        misses = [sum(lrfu_misses(layer, c, decay) for layer in steps) for c in caps]
        out[str(decay)] = hit_rates(misses, refs)
        print(f"lrfu lambda={decay:<6} " + " ".join(f"{h:.4f}" for h in out[str(decay)]), flush=True)
    scored = caps[1:]  # C = top_k (the first cap) holds just the current step under every demand policy
    means = {d: round(float(np.mean(rates[1:])), 4) for d, rates in out.items()}
    best = max(means, key=lambda d: means[d])
    print(f"best lambda by the mean over C = {scored}: {best} (wisp uses {LRFU_DECAY_PER_STEP})", flush=True)
    return {"trace": path.name, "caps": caps, "hit_rate": out, "mean_over_caps": means, "scored_caps": scored,
            "best": float(best), "chosen": LRFU_DECAY_PER_STEP}


def print_summary(results: dict) -> None:
    print("\nLRU, the best other demand policy (lfu/lrfu/arc), OPT and static, pooled hit rate:")
    for name, r in results.items():
        print(f"\n{name} ({r['references']} references)")
        print(f"{'C':>4}" + "".join(f"{p:>8}" for p in SHOWN) + "   best other  vs lru (points)")
        for i, c in enumerate(r["caps"]):
            row = {p: r["hit_rate"][p][i] for p in SHOWN}
            others = {p: row[p] for p in ("lfu", "lrfu", "arc")}
            best = max(others, key=lambda p: others[p])
            gain = 100 * (others[best] - row["lru"])
            print(f"{c:>4}" + "".join(f"{row[p]:>8.4f}" for p in SHOWN) + f"   {best:>10}  {gain:+.2f}")
        wins = {p: r["layers_beating_lru"][p] for p in ("lfu", "lrfu", "arc")}
        print(f"layers (of {len(r['layers'])}) where each beats LRU, per C: {wins}")


def plot(results: dict, path: Path) -> None:
    """Top row: hit rate per policy against C; bottom row: each policy's hit rate minus LRU's, in points."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 7), sharex="col")
    for col, (name, r) in enumerate(results.items()):
        lru = np.array(r["hit_rate"]["lru"])
        for p in SHOWN:
            style = {"marker": "o", "ms": 3, "label": p, "ls": "--" if p in ("opt", "static") else "-"}
            axes[0, col].plot(r["caps"], r["hit_rate"][p], **style)
            if p != "opt":  # OPT's gap (10-30 points) would flatten the others
                axes[1, col].plot(r["caps"], 100 * (np.array(r["hit_rate"][p]) - lru), **style)
        axes[0, col].set(title=name)
        axes[1, col].set(xlabel="expert slots per layer (C)")
    axes[0, 0].set_ylabel("hit rate (pooled over layers)")
    axes[1, 0].set_ylabel("hit rate - LRU's (points)")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared" / "data"))
    ap.add_argument("--sweep", action="store_true", help=f"also sweep LRFU's lambda on {SWEEP_TRACE}")
    ap.add_argument("--out", default="benchmarks/results/logs/replacement_policies.json")
    ap.add_argument("--plot", default="benchmarks/results/logs/replacement_policies.png")
    args = ap.parse_args()
    data = Path(args.data)
    record: dict = {"what": __doc__.split("\n\n")[0], "lrfu_decay_per_step": LRFU_DECAY_PER_STEP,
                    "command": f"python benchmarks/probes/replacement_policies.py{' --sweep' if args.sweep else ''} "
                               f"--out {args.out} --plot {args.plot}"}
    if args.sweep:
        rel, caps = TRACES[SWEEP_TRACE]
        record["lrfu_sweep"] = sweep_decay(data / rel, caps)
    with tempfile.TemporaryDirectory() as tmp:
        record["traces"] = {name: replay(name, data / rel, caps, tmp) for name, (rel, caps) in TRACES.items()}
    print_summary(record["traces"])
    Path(args.out).write_text(json.dumps(record, indent=1))
    plot(record["traces"], Path(args.plot))
    print(f"\nwrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
