"""Readers of other projects' routing traces into `RoutingTrace` (paths always come from the caller;
the data is never copied into the repository). Every reader sets `num_experts` and `metadata["model"]`.

Formats read (layouts as found in ../shared/data, see its README):
- Mixtral-8x7B decode npz (`*_decode_TxLxK.npz`): arrays p{i}_ids int16 [T, 32, 2] (-1 missing) and
  p{i}_weights float32, one pair per problem; `read_mixtral_npz` -> one trace per problem, in i order.
- Mixtral-8x7B JSONL (`*_routing.jsonl`): one record per (problem, decode token, layer),
  {"dataset", "problem_id", "layer", "experts": [e0, e1], "gating_probs": [p0, p1], "token_idx"};
  cells absent from the file are -1. `read_mixtral_jsonl` -> one trace per (dataset, problem_id), in
  first-appearance order. It agrees with the npz exactly (tested).
- FLAME-MoE-290M npz (`flame290m_*_TxLxK.npz`): ids int16 [S, P, L, K] = sequences x tokens x layers x k
  (32 x 64 x 8 x 6), weights, moe_layers [L]; 64 experts. Teacher-forced, so `read_flame_npz` flattens
  sequences into one token stream, each token its own step (step_per_sequence=True: a sequence is a step),
  and marks the S sequences (`RoutingTrace.sequences`).
- vLLM layer-0 logs (`*layer0*.jsonl`): a {"type": "meta", "model_id", "top_k", ...} line, then
  {"type": "route", "req_id", "token_idx", "layer", "topk_ids", "topk_weights"} rows in execution order.
  The first rows are vLLM's profiling dummies (OLMoE-1B-7B: 2048 rows, 64 experts top-8;
  Qwen1.5-MoE-A2.7B: 8192 rows, 60 experts top-4). `read_vllm_layer_log` skips them and also drops any
  LATER repeat of that profiling pass (the Qwen log holds a second, identical 8192-row pass in the
  middle, so only 2434 of its 10,626 rows after the first pass are real). Where token_idx restarts from
  0 it numbers the tokens of one forward pass, so each pass becomes a step (Qwen); a log whose
  token_idx only grows (OLMoE) has no step boundaries and every token is its own step.

`load_any(path)` dispatches on the file name, then on the content, and returns ONE trace (problems
concatenated, each token its own step), whose `sequences()` are the file's problems or sequences (a vLLM log,
its requests interleaved, and a wisp trace without "sequence_lengths" are one sequence).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from wisp.trace.format import RoutingTrace

MIXTRAL = ("neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8", 8)  # model, experts
FLAME = ("CMU-FLAME/flame-moe-290m (iter 5473)", 64)
# model_id -> (dummy profiling rows at the start, routed experts)
VLLM_LOGS = {
    "allenai/OLMoE-1B-7B-0924": (2048, 64),
    "Qwen/Qwen1.5-MoE-A2.7B-Chat": (8192, 60),
}


def read_mixtral_npz(path: str | Path) -> list[RoutingTrace]:
    path = Path(path)
    with np.load(path, allow_pickle=False) as z:
        idx = sorted(int(m.group(1)) for k in z.files if (m := re.fullmatch(r"p(\d+)_ids", k)))
        if not idx:
            raise ValueError(f"{path}: no p<i>_ids arrays (keys {z.files})")
        out = []
        for i in idx:
            w = z[f"p{i}_weights"] if f"p{i}_weights" in z.files else None
            meta = {"model": MIXTRAL[0], "note": f"{path.name} problem {i}: decode tokens, greedy"}
            out.append(RoutingTrace(z[f"p{i}_ids"], w, num_experts=MIXTRAL[1], metadata=meta))
    return out


def read_mixtral_jsonl(path: str | Path) -> list[RoutingTrace]:
    path = Path(path)
    cells: dict[tuple[str, int], list[dict]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                cells.setdefault((str(r["dataset"]), int(r["problem_id"])), []).append(r)
    every = [r for recs in cells.values() for r in recs]
    L = max((int(r["layer"]) for r in every), default=-1) + 1  # layers and K are shared by all problems
    K = max((len(r["experts"]) for r in every), default=0)
    out = []
    for (dataset, pid), recs in cells.items():
        T = max(int(r["token_idx"]) for r in recs) + 1
        ids = np.full((T, L, K), -1, dtype=np.int16)
        weights = np.full((T, L, K), np.nan, dtype=np.float32)
        for r in recs:
            t, l = int(r["token_idx"]), int(r["layer"])
            ids[t, l, : len(r["experts"])] = r["experts"]
            weights[t, l, : len(r["gating_probs"])] = r["gating_probs"]
        meta = {"model": MIXTRAL[0], "note": f"{path.name} {dataset} problem {pid}: decode tokens, greedy"}
        out.append(RoutingTrace(ids, weights, num_experts=MIXTRAL[1], metadata=meta))
    return out


def read_flame_npz(path: str | Path, step_per_sequence: bool = False) -> RoutingTrace:
    path = Path(path)
    with np.load(path, allow_pickle=False) as z:
        ids4 = z["ids"]
        if ids4.ndim != 4:
            raise ValueError(f"{path}: ids must be [sequences, tokens, layers, k], got {ids4.shape}")
        S, P, L, K = ids4.shape
        weights = z["weights"].reshape(S * P, L, K) if "weights" in z.files else None
        layers = z["moe_layers"] if "moe_layers" in z.files else None
        step = np.repeat(np.arange(S), P) if step_per_sequence else None
        meta = {"model": FLAME[0], "note": f"{path.name}: {S} teacher-forced sequences x {P} tokens",
                "sequence_lengths": [P] * S}
        return RoutingTrace(ids4.reshape(S * P, L, K), weights, step, layers, FLAME[1], meta)


def read_vllm_layer_log(
    path: str | Path, skip_rows: int | None = None, num_experts: int | None = None, drop_repeat_profiles: bool = True
) -> RoutingTrace:
    """One-layer vLLM route log -> RoutingTrace; skip_rows / num_experts default from the meta's model."""
    path = Path(path)
    meta, rows = _vllm_meta_and_routes(path)
    model = meta.get("model_id", "?")
    known_skip, known_n = VLLM_LOGS.get(model, (0, None))
    skip = known_skip if skip_rows is None else skip_rows
    n_exp = num_experts or meta.get("num_experts") or known_n
    if n_exp is None:
        raise ValueError(f"{path}: unknown model {model!r}; pass num_experts")
    layers = sorted({int(r["layer"]) for r in rows})
    if len(layers) != 1:
        raise ValueError(f"{path}: expected one logged layer, found {layers}")
    dummy, real = rows[:skip], rows[skip:]
    passes, dropped = _cut_into_passes(real), 0
    if drop_repeat_profiles and dummy:
        passes, dropped = _drop_profile_repeats(passes, dummy)
    ids, weights = _one_layer_arrays([r for p in passes for r in p], int(meta.get("top_k", 0)))
    step = np.repeat(np.arange(len(passes)), [len(p) for p in passes]) if len(passes) > 1 else None
    note = f"{path.name}: layer {layers[0]}, skipped {skip} profiling rows and {dropped} repeated profiling pass(es)"
    return RoutingTrace(ids, weights, step, layers, int(n_exp), {"model": model, "note": note})


def _vllm_meta_and_routes(path: Path) -> tuple[dict, list[dict]]:
    """The log's meta line (the last one; {} if none) and its route rows, in file order."""
    meta, rows = {}, []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("type") == "meta":
                meta = r
            elif r.get("type", "route") == "route":
                rows.append(r)
    return meta, rows


def _cut_into_passes(rows: list[dict]) -> list[list[dict]]:
    """Rows cut into forward passes wherever token_idx restarts (one pass if it only grows)."""
    passes, cur = [], []
    for r in rows:
        if cur and int(r["token_idx"]) <= int(cur[-1]["token_idx"]):
            passes.append(cur)
            cur = []
        cur.append(r)
    if cur:
        passes.append(cur)
    return passes


def _drop_profile_repeats(passes: list[list[dict]], dummy: list[dict]) -> tuple[list[list[dict]], int]:
    """The passes that are not a repeat of the profiling rows `dummy`, and how many were dropped."""
    signature = _route_signature(dummy)
    kept = [p for p in passes if len(p) != len(signature) or _route_signature(p) != signature]
    return kept, len(passes) - len(kept)


def _route_signature(rows: list[dict]) -> list[tuple[tuple, tuple]]:
    return [(tuple(r["topk_ids"]), tuple(r["topk_weights"])) for r in rows]


def _one_layer_arrays(tokens: list[dict], default_k: int) -> tuple[np.ndarray, np.ndarray]:
    """ids int16 and weights float32 [T, 1, K] of one layer's route rows (-1 / NaN where a row is short)."""
    K = max((len(r["topk_ids"]) for r in tokens), default=default_k)
    ids = np.full((len(tokens), 1, K), -1, dtype=np.int16)
    weights = np.full((len(tokens), 1, K), np.nan, dtype=np.float32)
    for t, r in enumerate(tokens):
        ids[t, 0, : len(r["topk_ids"])] = r["topk_ids"]
        weights[t, 0, : len(r["topk_weights"])] = r["topk_weights"]
    return ids, weights


def load_any(path: str | Path) -> RoutingTrace:
    """Read any supported trace as one RoutingTrace (dispatch on file name, then content)."""
    path = Path(path)
    name = path.name
    if name.endswith("_decode_TxLxK.npz"):
        return RoutingTrace.concat(read_mixtral_npz(path))
    if name.startswith("flame") and name.endswith(".npz"):
        return read_flame_npz(path)
    if name.endswith("_routing.jsonl"):
        return RoutingTrace.concat(read_mixtral_jsonl(path))
    if "layer0" in name and name.endswith(".jsonl"):
        return read_vllm_layer_log(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
        if "p0_ids" in keys:
            return RoutingTrace.concat(read_mixtral_npz(path))
        if "moe_layers" in keys:
            return read_flame_npz(path)
        return RoutingTrace.load(path)
    if path.suffix == ".jsonl":
        with open(path) as f:
            first = json.loads(f.readline() or "{}")
        if first.get("type") in ("meta", "route"):
            return read_vllm_layer_log(path)
        if "problem_id" in first and "experts" in first:
            return RoutingTrace.concat(read_mixtral_jsonl(path))
        return RoutingTrace.load(path)
    raise ValueError(f"{path}: unknown routing-trace format (expected .npz or .jsonl)")
