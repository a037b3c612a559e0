"""Question: how precisely can the online expert predictors (`wisp.core.learners.coactivation`) name the
experts a token will route to, and would prefetching their guesses cut the copies? (CPU: real traces.)

Asked: 2026-12-01.

Answer (docs/prefetch.md; benchmarks/results/logs/prefetch_precision.json): the cross-layer predictor is the
best, P@k 0.404 / 0.421 on Mixtral-8x7B HumanEval / GSM8K (random: 0.25) and 0.440 on FLAME-MoE-290M
(random: 0.094); the layer-0 logs reach 0.318 (OLMoE, transition) and 0.126 (Qwen1.5). In the closed loop it
cuts demand misses but adds copies: Mixtral HumanEval at C = 4, 22.99 LRU copies a token against 19.79 demand
misses and 33.61 copies in all with prefetch; FLAME at C = 8, 36.32 against 22.63 and 56.27.

The scores themselves are `wisp.bench.predictor_scores` (tested there).

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

    PYTHONPATH=. python benchmarks/probes/prefetch_precision.py [--data ../shared/data] \
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

from wisp.bench.predictor_scores import PredictorFactory, lru_breakdown, precision_by_layer, prefetch_replay
from wisp.core.learners.coactivation import (CrossLayerPredictor, FrequencyPredictor, RecencyPredictor,
                                             TransitionPredictor, predict_online)
from wisp.trace.readers import load_any

TRACES = (  # name, path under --data, LRU caps
    ("mixtral-8x7b humaneval", "routing_mixtral8x7b/humaneval_2_decode_TxLxK.npz", (2, 4, 6)),
    ("mixtral-8x7b gsm8k", "routing_mixtral8x7b/gsm8k_2_decode_TxLxK.npz", (2, 4, 6)),
    ("flame-moe-290m", "flame_moe_290m_dynande/flame290m_iter5473_32seq_x64tok_TxLxK.npz", (8, 16)),
    ("olmoe-1b-7b layer 0", "layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl", (8, 16)),
    ("qwen1.5-moe layer 0", "layer0_only_vllm_logs/qwen15moe_a27b_layer0_gsm8k_TotaniYash.jsonl", (8, 16)),
)
PREDICTORS: tuple[tuple[str, PredictorFactory], ...] = (
    ("last token", RecencyPredictor),
    ("frequency", FrequencyPredictor),
    ("transition", TransitionPredictor),
    ("cross-layer", CrossLayerPredictor),
    ("cross-layer, decay 0.99", lambda L, n: CrossLayerPredictor(L, n, decay=0.99)),
)


def scored_layers(name: str, num_layers: int) -> list[int]:
    """Layers a predictor is scored on: the cross-layer ones need a source layer, so not layer 0."""
    return list(range(1, num_layers)) if name.startswith("cross-layer") else list(range(num_layers))


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
                  "lru": {str(c): lru_breakdown(at_k, ids, layers, c) for c in caps},
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
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared" / "data"))
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
        command = "PYTHONPATH=. python benchmarks/probes/prefetch_precision.py --out " + args.out
        Path(args.out).write_text(json.dumps({"command": command, "records": records}, indent=1) + "\n")


if __name__ == "__main__":
    main()
