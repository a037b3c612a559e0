"""RoutingTrace: wisp's routing-trace format (what the recorder writes and `wisp plan` / `wisp sim` read).

A trace is T tokens in processing order, L MoE layers, top-K routing:
- `ids`      int16   [T, L, K]  routed expert ids; -1 = missing (not logged / padding);
- `weights`  float32 [T, L, K]  optional router weights (NaN or anything where ids == -1);
- `step`     int32   [T]        optional engine step of each token, non-decreasing: the tokens of one
                                step form ONE expert set per layer (a prefill or a batched decode step).
                                Absent: every token is its own step (single-stream decode);
- `layers`   int32   [L]        the model's index of each MoE layer (distinct);
- `metadata` a JSON object: "model", "note", and "num_experts" when known; "sequence_lengths" [S] when the
                                trace holds several sequences (requests, problems), one after another in
                                token order: the tokens of each (`sequences()` cuts the trace there).
                                Absent: the whole trace is one sequence.

On disk (`save` / `load`, chosen by suffix; `save` writes a whole file or none, never a partial one):
- `.npz`: arrays `ids`, `layers`, optional `weights`, `step`, and `metadata` (a JSON string, 0-d unicode
  array, so loading never needs pickle);
- `.jsonl`: an optional first line {"meta": {...}} (the metadata, plus "layers", "top_k" and
  "has_weights"), then one object per (token, layer):
  {"step": int, "layer": int, "ids": [...], "weights": [...]} with an optional "token": int.
  Without "token", the i-th line of a (step, layer) pair is the step's i-th token; steps are sorted by
  value and a step has as many tokens as its most-populated layer. "ids" may be shorter than K (padded
  with -1) and may contain -1; "weights" is optional. Layers are the meta's "layers" or the sorted
  distinct "layer" values. `save` writes "token" and the full K-wide rows, so a round trip is exact
  (a trace without `step` comes back with step = token index, which means the same).

`replayed_over(layers)` spreads a trace of fewer layers over a model's layers at token offsets: an
approximation for simulation only (`wisp sim --sessions --replay-layers`), labelled as such in its note.

Invariants: ids >= -1 and, when num_experts is given, ids < num_experts; weights (if any) has ids' shape;
step (if any) is non-decreasing with length T; layers are distinct; sequence lengths (if given) are positive
and sum to T (`concat` keeps each input's sequences). `steps(layer)` is a pure function
of ids and step: each step's sorted distinct non-missing experts at that layer (possibly empty).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wisp.core.experts.recency import touch_order


class RoutingTrace:
    def __init__(
        self,
        ids: np.ndarray,
        weights: np.ndarray | None = None,
        step: np.ndarray | None = None,
        layers: Sequence[int] | np.ndarray | None = None,
        num_experts: int | None = None,
        metadata: dict[str, Any] | None = None,
    ):
        ids = np.asarray(ids)
        if ids.ndim != 3:
            raise ValueError(f"ids must be [T, L, K], got shape {ids.shape}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            fractional = ids[~np.isfinite(ids) | (ids != np.round(ids))] if np.issubdtype(ids.dtype, np.number) else ids
            if not np.issubdtype(ids.dtype, np.number) or fractional.size:
                example = fractional.flat[0] if fractional.size else ids.flat[0]
                raise ValueError(f"expert ids must be whole numbers, found {example!r}")
        if ids.size and ids.min() < -1:
            raise ValueError("expert ids must be >= -1 (-1 = missing)")
        if ids.size and ids.max() > np.iinfo(np.int16).max:
            raise ValueError(f"expert ids must be below {np.iinfo(np.int16).max + 1}, found {int(ids.max())}")
        self.ids = ids.astype(np.int16)
        T, L, _ = ids.shape
        self.weights = None if weights is None else np.asarray(weights, dtype=np.float32)
        if self.weights is not None and self.weights.shape != ids.shape:
            raise ValueError(f"weights shape {self.weights.shape} != ids shape {ids.shape}")
        self.step = None if step is None else np.asarray(step).astype(np.int32)
        if self.step is not None:
            if self.step.shape != (T,):
                raise ValueError(f"step must be [T] = [{T}], got {self.step.shape}")
            if T > 1 and np.any(np.diff(self.step) < 0):
                raise ValueError("step must be non-decreasing (tokens in processing order)")
        self.layers = np.arange(L, dtype=np.int32) if layers is None else np.asarray(layers, dtype=np.int32)
        if self.layers.shape != (L,) or len(set(self.layers.tolist())) != L:
            raise ValueError(f"layers must be {L} distinct indices, got {self.layers.tolist()}")
        self.metadata = dict(metadata or {})
        if num_experts is None:
            num_experts = self.metadata.get("num_experts")
        if num_experts is not None:
            num_experts = int(num_experts)
            if ids.size and ids.max() >= num_experts:
                raise ValueError(f"expert id {int(ids.max())} >= num_experts {num_experts}")
            self.metadata["num_experts"] = num_experts
        self._num_experts = num_experts
        if "sequence_lengths" in self.metadata:
            lengths = [int(n) for n in self.metadata["sequence_lengths"]]
            if any(n < 1 for n in lengths) or sum(lengths) != T:
                raise ValueError(f"sequence_lengths {lengths} must be positive and sum to T = {T}")
            self.metadata["sequence_lengths"] = lengths

    # -- shape ----------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self.ids.shape[0]

    @property
    def num_layers(self) -> int:
        return self.ids.shape[1]

    @property
    def top_k(self) -> int:
        return self.ids.shape[2]

    @property
    def num_experts(self) -> int:
        """As given (or in metadata), else the largest id + 1 (0 for an all-missing trace)."""
        if self._num_experts is not None:
            return self._num_experts
        return int(self.ids.max()) + 1 if self.ids.size else 0

    @property
    def sequence_lengths(self) -> list[int]:
        """The tokens of each sequence the trace holds, in order (sum T): metadata's "sequence_lengths", else
        one sequence of every token (none in an empty trace)."""
        return list(self.metadata.get("sequence_lengths", [self.num_tokens] if self.num_tokens else []))

    def __repr__(self) -> str:
        model = self.metadata.get("model", "?")
        return (f"RoutingTrace(model={model!r}, T={self.num_tokens}, L={self.num_layers}, K={self.top_k}, "
                f"N={self.num_experts}, steps={'per-token' if self.step is None else len(np.unique(self.step))})")

    # -- views ----------------------------------------------------------------------------------------
    def sequences(self) -> list[RoutingTrace]:
        """The trace cut into its sequences, in order: each one's tokens (ids, weights, step), with the same
        layers, model and num_experts."""
        meta = {k: v for k, v in self.metadata.items() if k != "sequence_lengths"}
        bounds = np.cumsum([0, *self.sequence_lengths])
        return [RoutingTrace(self.ids[a:b], None if self.weights is None else self.weights[a:b],
                             None if self.step is None else self.step[a:b], self.layers, self._num_experts,
                             {**meta, "note": f"{meta.get('note', 'trace')}; sequence {i}"})
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]

    def layer_position(self, layer: int) -> int:
        hit = np.flatnonzero(self.layers == int(layer))
        if hit.size == 0:
            raise ValueError(f"layer {layer} is not a MoE layer of this trace (layers {self.layers.tolist()})")
        return int(hit[0])

    def steps(self, layer: int, per_token: bool = False) -> list[list[int]]:
        """Each step's distinct experts at model layer `layer` (a value of `layers`), in the pager's touch
        order (`wisp.core.experts.recency`: by the last token routing to each, then id; one token's step is its
        ids sorted), so `wisp.plan.miss_curves` replays exactly what `ExpertPager` did.

        Missing ids are dropped; a step with none is an empty list (kept, so steps align across layers).
        per_token=True ignores `step` and makes every token its own step.
        """
        col = self.ids[:, self.layer_position(layer), :]
        if self.num_tokens == 0:
            return []
        if self.step is None or per_token:
            return [sorted(set(row[row >= 0].tolist())) for row in col]
        bounds = np.flatnonzero(np.diff(self.step)) + 1
        return [touch_order(block.tolist()) for block in np.split(col, bounds)]

    @classmethod
    def concat(cls, traces: Sequence[RoutingTrace], metadata: dict[str, Any] | None = None) -> RoutingTrace:
        """Traces one after another (same layers and K). Steps stay distinct; a trace without `step`
        contributes one step per token. Each input's sequences stay sequences of the result (a trace
        without "sequence_lengths" is one). num_experts is the largest known one."""
        if not traces:
            raise ValueError("nothing to concatenate")
        first = traces[0]
        for t in traces[1:]:
            if not np.array_equal(t.layers, first.layers) or t.top_k != first.top_k:
                raise ValueError("traces to concatenate must share layers and top_k")
        ids = np.concatenate([t.ids for t in traces])
        weights = None
        if all(t.weights is not None for t in traces):
            weights = np.concatenate([t.weights for t in traces])
        step = None
        if any(t.step is not None for t in traces):
            parts, offset = [], 0
            for t in traces:
                s = np.arange(t.num_tokens) if t.step is None else t.step.astype(np.int64) - int(t.step.min(initial=0))
                parts.append(s + offset)
                offset += int(s.max(initial=-1)) + 1
            step = np.concatenate(parts)
        meta = dict(first.metadata) if metadata is None else dict(metadata)
        if metadata is None and len(traces) > 1:
            meta["note"] = " + ".join(str(t.metadata.get("note", "?")) for t in traces)
        meta["num_experts"] = max(t.num_experts for t in traces)
        meta.pop("sequence_lengths", None)
        if len(lengths := [n for t in traces for n in t.sequence_lengths]) > 1:
            meta["sequence_lengths"] = lengths
        return cls(ids, weights, step, first.layers, metadata=meta)

    def replayed_over(self, layers: Sequence[int]) -> RoutingTrace:
        """An APPROXIMATION for a trace that logged fewer layers than a model has: model layer `layers[i]`
        routes as trace layer i % L, starting i * T // len(layers) tokens later (cyclically), so layers
        do not all reuse experts at the same moments. Real layers route differently; say so wherever
        the result is reported. Steps are dropped (every token its own step); the note says what was done."""
        n, t = len(layers), self.num_tokens

        def spread(a: np.ndarray) -> np.ndarray:
            return np.stack([np.roll(a[:, i % self.num_layers], -(i * t // n), axis=0) for i in range(n)], axis=1)

        weights = None if self.weights is None else spread(self.weights)
        note = (f"{self.metadata.get('note', 'trace')}; layers {self.layers.tolist()} replayed for {n} MoE layers, "
                f"layer i starting i*T/{n} tokens later (an approximation: real layers route differently)")
        ids = spread(self.ids)
        return RoutingTrace(ids, weights, None, layers, self.num_experts, {**self.metadata, "note": note})

    # -- files ----------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the trace to `path` whole or not at all: it is written to a temporary file beside `path`
        and renamed over it, so a write that fails (a full disk: OSError ENOSPC) raises and leaves neither
        a partial file nor the temporary one, and a file already at `path` untouched."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            if path.suffix == ".jsonl":
                self._save_jsonl(tmp)
            else:
                self._save_npz(tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _save_npz(self, path: Path) -> None:
        arrays = {"ids": self.ids, "layers": self.layers, "metadata": np.array(json.dumps(self.metadata))}
        if self.weights is not None:
            arrays["weights"] = self.weights
        if self.step is not None:
            arrays["step"] = self.step
        with open(path, "wb") as f:  # a file object, so numpy does not append ".npz" to other suffixes
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> RoutingTrace:
        path = Path(path)
        if path.suffix == ".jsonl":
            return cls._load_jsonl(path)
        with np.load(path, allow_pickle=False) as z:
            if "ids" not in z.files:
                raise ValueError(f"{path}: not a wisp routing trace (no 'ids' array; keys {z.files})")
            meta = json.loads(str(z["metadata"])) if "metadata" in z.files else {}
            return cls(
                z["ids"],
                z["weights"] if "weights" in z.files else None,
                z["step"] if "step" in z.files else None,
                z["layers"] if "layers" in z.files else None,
                metadata=meta,
            )

    def _save_jsonl(self, path: Path) -> None:
        step = np.arange(self.num_tokens) if self.step is None else self.step
        with open(path, "w") as f:
            head = {**self.metadata, "layers": self.layers.tolist(), "top_k": self.top_k,
                    "has_weights": self.weights is not None}
            f.write(json.dumps({"meta": head}) + "\n")
            for t in range(self.num_tokens):
                for j, layer in enumerate(self.layers.tolist()):
                    rec = {"token": t, "step": int(step[t]), "layer": layer, "ids": self.ids[t, j].tolist()}
                    if self.weights is not None:
                        rec["weights"] = [float(w) for w in self.weights[t, j]]
                    f.write(json.dumps(rec) + "\n")

    @classmethod
    def _load_jsonl(cls, path: Path) -> RoutingTrace:
        meta: dict[str, Any] = {}
        recs = []
        with open(path) as f:
            for n, line in enumerate(f):
                if not line.strip():
                    continue
                obj = json.loads(line)
                if "meta" in obj:
                    meta = dict(obj["meta"])
                    continue
                if not {"step", "layer", "ids"} <= obj.keys():
                    raise ValueError(f"{path}:{n + 1}: a record needs 'step', 'layer' and 'ids'")
                recs.append(obj)
        layers = meta.pop("layers", None)
        top_k = int(meta.pop("top_k", 0))
        has_w = bool(meta.pop("has_weights", False)) or any("weights" in r for r in recs)
        if layers is None:
            layers = sorted({int(r["layer"]) for r in recs})
        col = {int(l): j for j, l in enumerate(layers)}
        K = max([len(r["ids"]) for r in recs] + [top_k])
        if recs and all("token" in r for r in recs):
            tok = [int(r["token"]) for r in recs]
            T = max(tok) + 1
            step = np.zeros(T, dtype=np.int64)
            for r, t in zip(recs, tok):
                step[t] = int(r["step"])
        else:  # i-th record of (step, layer) = the step's i-th token
            step_vals = sorted({int(r["step"]) for r in recs})
            seen: dict[tuple[int, int], int] = {}
            for r in recs:
                key = (int(r["step"]), int(r["layer"]))
                r["_i"] = seen.get(key, 0)
                seen[key] = r["_i"] + 1
            width = {s: 0 for s in step_vals}
            for (s, _), c in seen.items():
                width[s] = max(width[s], c)
            first, T = {}, 0
            for s in step_vals:
                first[s], T = T, T + width[s]
            tok = [first[int(r["step"])] + r["_i"] for r in recs]
            step = np.repeat(np.array(step_vals, dtype=np.int64), [width[s] for s in step_vals])
        ids = np.full((T, len(layers), K), -1, dtype=np.int64)
        weights = np.full((T, len(layers), K), np.nan, dtype=np.float32) if has_w else None
        for r, t in zip(recs, tok):
            j = col[int(r["layer"])]
            row = r["ids"]
            ids[t, j, : len(row)] = row
            if has_w and "weights" in r:
                weights[t, j, : len(r["weights"])] = r["weights"]
        return cls(ids, weights, step, layers, metadata=meta)
