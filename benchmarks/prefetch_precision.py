"""Precision of the online expert predictors (`wisp.core.learners.coactivation`) on real routing traces (CPU only).

For each trace and predictor, the predictor runs online over the trace (`predict_online`: predict a cell
before observing it, counts only from the past) and is scored three ways:
1. precision@k, k = the model's top-k and 2 x top-k: |predicted & routed| / |predicted| over a layer's
   tokens, then averaged over layers (cells that routed nothing, Mixtral's few missing ones, are skipped;
   the cross-layer predictor is scored on layers 1..L-1 only, layer 0 having no source layer);
2. against an LRU cache of C experts per layer (the pager's policy, no prefetch), each prediction at
   k = top-k is resident (no copy needed), useful (not resident and routed: a miss it would have
   saved) or wasted (not resident and not routed: a copy for nothing). Useful precision = useful /
   predicted, per layer then averaged; "misses named" = useful / LRU misses and "right copies" =
   useful / (useful + wasted), the share of the copies a prefetcher would issue that are used, over all layers;
3. a closed-loop replay: before each cell the top min(k, C) predictions are copied in (made most
   recent, evicting LRU slots), then the cell's experts are looked up. Demand misses (copies on the
   critical path) and all copies per token, against plain LRU's misses per token (summed over layers).

Traces (paths under --data, see ../shared/data/README.md), read by `wisp.trace.readers.load_any`, each one
session (problems / sequences concatenated, counts carried across them): Mixtral-8x7B decode, HumanEval
and GSM8K (32 layers, top-2 of 8; caps 2/4/6); FLAME-MoE-290M (8 layers, top-6 of 64, teacher-forced;
caps 8/16); OLMoE-1B-7B and Qwen1.5-MoE layer 0 (top-8 of 64 / top-4 of 60; caps 8/16). The two layer-0
logs are batched vLLM runs (requests interleaved, no request ids), so there "the next token" is the next
row of the log, usually another request's token: only the predictors' same-layer behaviour is measured.

    PYTHONPATH=. python benchmarks/prefetch_precision.py [--data ../shared/data] \
        [--out benchmarks/results/logs/prefetch_precision.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from wisp.core.learners.coactivation import (CrossLayerPredictor, ExpertPredictor, FrequencyPredictor, RecencyPredictor,
                                    TransitionPredictor, predict_online)
from wisp.core.experts.recency import touch_order
from wisp.trace.readers import load_any

TRACES = (  # name, path under --data, LRU caps
    ("mixtral-8x7b humaneval", "routing_mixtral8x7b/humaneval_2_decode_TxLxK.npz", (2, 4, 6)),
    ("mixtral-8x7b gsm8k", "routing_mixtral8x7b/gsm8k_2_decode_TxLxK.npz", (2, 4, 6)),
    ("flame-moe-290m", "flame_moe_290m_dynande/flame290m_iter5473_32seq_x64tok_TxLxK.npz", (8, 16)),
    ("olmoe-1b-7b layer 0", "layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl", (8, 16)),
    ("qwen1.5-moe layer 0", "layer0_only_vllm_logs/qwen15moe_a27b_layer0_gsm8k_TotaniYash.jsonl", (8, 16)),
)
PredictorFactory = Callable[[int, int], ExpertPredictor]  # (num_layers, num_experts) -> a fresh predictor
PREDICTORS: tuple[tuple[str, PredictorFactory], ...] = (
    ("last token", RecencyPredictor),
    ("frequency", FrequencyPredictor),
    ("transition", TransitionPredictor),
    ("cross-layer", CrossLayerPredictor),
    ("cross-layer, decay 0.99", lambda L, n: CrossLayerPredictor(L, n, decay=0.99)),
)


def routed(ids: np.ndarray, t: int, layer: int) -> set[int]:
    return {int(e) for e in ids[t, layer] if e >= 0}


def scored_layers(name: str, num_layers: int) -> list[int]:
    """Layers a predictor is scored on: the cross-layer ones need a source layer, so not layer 0."""
    return list(range(1, num_layers)) if name.startswith("cross-layer") else list(range(num_layers))


def precision_by_layer(predicted: np.ndarray, ids: np.ndarray, layers: list[int]) -> list[float]:
    """For each layer: sum |predicted & routed| / sum |predicted| over its tokens that routed something
    (predicted is [T, L, k], -1 padded; NaN for a layer with no prediction at all)."""
    out = []
    for layer in layers:
        hits = made = 0
        for t in range(ids.shape[0]):
            actual = routed(ids, t, layer)
            if actual:
                guess = {int(e) for e in predicted[t, layer] if e >= 0}
                hits, made = hits + len(guess & actual), made + len(guess)
        out.append(hits / made if made else float("nan"))
    return out


def online_precision(make: PredictorFactory, ids: np.ndarray, num_experts: int, k: int, layers: list[int]) -> list[float]:
    """precision_by_layer of a fresh predictor run online over ids [T, L, K]."""
    return precision_by_layer(predict_online(make(ids.shape[1], num_experts), ids, k), ids, layers)


def lru_resident_before(ids: np.ndarray, layer: int, cap: int) -> list[set[int]]:
    """The experts an LRU cache of `cap` holds before each token at `layer` (one token = one pager step,
    touched in `wisp.core.experts.recency` order; a missing cell touches nothing)."""
    order: list[int] = []  # least recent first
    out = []
    for t in range(ids.shape[0]):
        out.append(set(order[-cap:]))
        step = touch_order([ids[t, layer].tolist()])
        order = [e for e in order if e not in step] + step
    return out


def lru_split(predicted: np.ndarray, ids: np.ndarray, layers: list[int], cap: int) -> dict:
    """Predictions against plain LRU (no prefetch): resident / useful / wasted, useful precision per layer."""
    useful_precision, totals = [], {"predicted": 0, "resident": 0, "useful": 0, "wasted": 0, "lru_misses": 0}
    for layer in layers:
        resident_sets = lru_resident_before(ids, layer, cap)
        made = useful = 0
        for t, resident in enumerate(resident_sets):
            actual = routed(ids, t, layer)
            if not actual:
                continue
            guess = {int(e) for e in predicted[t, layer] if e >= 0}
            made, useful = made + len(guess), useful + len(guess & actual - resident)
            totals["resident"] += len(guess & resident)
            totals["wasted"] += len(guess - actual - resident)
            totals["lru_misses"] += len(actual - resident)
        totals["predicted"] += made
        totals["useful"] += useful
        useful_precision.append(useful / made if made else float("nan"))
    made_any = [u for u in useful_precision if not np.isnan(u)]
    return {"useful_precision": float(np.mean(made_any)) if made_any else float("nan"),
            "misses_named": totals["useful"] / max(totals["lru_misses"], 1),
            "right_copies": totals["useful"] / max(totals["useful"] + totals["wasted"], 1), **totals}


def prefetch_replay(predicted: np.ndarray, ids: np.ndarray, layers: list[int], cap: int) -> dict:
    """Closed loop: each cell's top min(k, cap) predictions are copied in first (most recent = best), then
    the routed experts are looked up. Per token, summed over `layers`: demand misses and all copies."""
    demand = prefetched = plain = 0
    for layer in layers:
        order: list[int] = []  # with prefetch, least recent first
        plain_order: list[int] = []
        for t in range(ids.shape[0]):
            guess = [int(e) for e in predicted[t, layer][:cap] if e >= 0]
            prefetched += sum(e not in order[-cap:] for e in guess)
            order = [e for e in order if e not in guess] + guess[::-1]
            step = touch_order([ids[t, layer].tolist()])
            demand += sum(e not in order[-cap:] for e in step)
            plain += sum(e not in plain_order[-cap:] for e in step)
            order = [e for e in order if e not in step] + step
            plain_order = [e for e in plain_order if e not in step] + step
    T = ids.shape[0]
    return {"lru_misses_per_token": plain / T, "demand_misses_per_token": demand / T,
            "copies_per_token": (demand + prefetched) / T, "prefetch_copies_per_token": prefetched / T}


def measure_trace(name: str, path: Path, caps: tuple[int, ...], echo: Callable[[str], None]) -> dict:
    trace = load_any(path)
    ids, K, L, N = trace.ids, trace.top_k, trace.num_layers, trace.num_experts
    record = {"trace": name, "file": path.name, "model": trace.metadata.get("model"),
              "note": trace.metadata.get("note"), "tokens": int(trace.num_tokens), "layers": L, "top_k": K,
              "num_experts": N, "caps": list(caps), "random_precision_at_top_k": K / N, "predictors": {}}
    for pname, make in PREDICTORS:
        if pname.startswith("cross-layer") and L < 2:
            continue
        start = time.perf_counter()
        predicted = predict_online(make(L, N), ids, 2 * K)
        layers = scored_layers(pname, L)
        at_k = predicted[:, :, :K]
        by_layer = {"top_k": precision_by_layer(at_k, ids, layers), "2x_top_k": precision_by_layer(predicted, ids, layers)}
        result = {"scored_layers": [layers[0], layers[-1]],
                  "precision_at_top_k": float(np.nanmean(by_layer["top_k"])),
                  "precision_at_2x_top_k": float(np.nanmean(by_layer["2x_top_k"])),
                  "precision_by_layer": by_layer,
                  "lru": {str(c): lru_split(at_k, ids, layers, c) for c in caps},
                  "prefetch_replay": {str(c): prefetch_replay(at_k, ids, layers, c) for c in caps}}
        result["seconds"] = round(time.perf_counter() - start, 2)
        record["predictors"][pname] = result
        echo(f"  {name:22} {pname:24} P@{K}={result['precision_at_top_k']:.3f}  ({result['seconds']} s)")
    return record


def tables(records: list[dict]) -> str:
    """Markdown: precision and useful precision per predictor, then the closed-loop replay."""
    rows = ["| trace | predictor | P@k | P@2k | useful P@k / misses named / right copies, by LRU cap |", "|---|---|---|---|---|"]
    for rec in records:
        for pname, r in rec["predictors"].items():
            lru = ", ".join(f"C={c}: {v['useful_precision']:.3f} / {v['misses_named']:.2f} / {v['right_copies']:.2f}"
                            for c, v in r["lru"].items())
            rows.append(f"| {rec['trace']} (k={rec['top_k']}) | {pname} | {r['precision_at_top_k']:.3f} | "
                        f"{r['precision_at_2x_top_k']:.3f} | {lru} |")
    rows += ["", "| trace | predictor | layers | cap | LRU misses/token | with prefetch: demand misses/token | copies/token |",
             "|---|---|---|---|---|---|---|"]
    for rec in records:
        for pname, r in rec["predictors"].items():
            first, last = r["scored_layers"]
            for c, v in r["prefetch_replay"].items():
                rows.append(f"| {rec['trace']} | {pname} | {first}..{last} | {c} | {v['lru_misses_per_token']:.2f} | "
                            f"{v['demand_misses_per_token']:.2f} | {v['copies_per_token']:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--out", default=None, help="write the records as JSON here")
    ap.add_argument("--only", default=None, help="measure only traces whose name contains this")
    args = ap.parse_args(argv)
    data = Path(args.data)
    records = []
    for name, rel, caps in TRACES:
        if args.only and args.only not in name:
            continue
        if not (data / rel).exists():
            print(f"skipped {name}: {data / rel} not found", file=sys.stderr)
            continue
        records.append(measure_trace(name, data / rel, caps, print))
    print(tables(records))
    if args.out:
        command = "PYTHONPATH=. python benchmarks/prefetch_precision.py --out " + args.out
        Path(args.out).write_text(json.dumps({"command": command, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
