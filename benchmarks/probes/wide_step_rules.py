"""Question: which experts should stay in the C slots after a wide (expert-major) step, and should a batched
decode wider than C // top_k run as CUDA-graph groups or as one expert-major step? (CPU: real routing
replayed through LRU caches.)

Asked: 2026-12-01.

Answer (benchmarks/results/logs/wide_step_rules.json): the three "what stays" rules are within 0.1-1.8
hit-rate points of each other on the decode after a wide prefill (Mixtral-8x7B raw trace, C = 2 / 4 / 6:
ascending id 0.356 / 0.607 / 0.827, last token 0.357 / 0.610 / 0.829, pair count 0.358 / 0.609 / 0.831;
FLAME-MoE-290M, C = 8 / 16 / 32: 0.143 / 0.271 / 0.533, 0.144 / 0.274 / 0.545, 0.146 / 0.278 / 0.551). Last
token, never below ascending id, became the rule (`wisp.core.experts.recency`) after a GPU decode A/B
(benchmarks/results/logs/README.md). Four Mixtral decode streams together miss less as one expert-major
step than in graph groups: 3.96 / 2.55 / 1.24 against 5.86 / 3.34 / 1.46 misses per layer and step at
C = 2 / 4 / 6, so wide batches run expert-major.

1. What stays in the C slots after a wide step. The step's experts are touched in some order and the
   last C stay. Candidates: ascending id (the first rule), by the last token that routed to each
   expert (`ExpertPager.decide` since: `wisp.core.experts.recency`), by how many of the step's pairs routed to it. Measured: the decode hit rate
   after a prefill run as one wide step (Mixtral-8x7B's raw HumanEval/0 trace: a 135-token prefill, then
   decode; FLAME-MoE-290M: 48 teacher-forced tokens as the prefill, 16 as decode, 32 sequences).
2. Batched decode wider than C // top_k: CUDA-graph groups of C // top_k tokens (each group its own LRU
   step) against one expert-major step. Measured: misses per layer and step with the four Mixtral decode
   traces (GSM8K 0/1, HumanEval 0/1) decoded together, B = 4.

    python benchmarks/probes/wide_step_rules.py [--data ../shared/data] [--out benchmarks/results/logs/wide_step_rules.json]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np

RULES = ("id", "last token", "pair count")


def lru_misses(steps: list[list[list[int]]], cap: int, rule: str = "id") -> list[int]:
    """Misses per step of an LRU cache of `cap` experts; a step is a list of tokens' expert lists."""
    order: list[int] = []  # least recent first
    out = []
    for tokens in steps:
        last, count = {}, collections.Counter()
        for i, experts in enumerate(tokens):
            for e in experts:
                last[e], count[e] = i, count[e] + 1
        need = sorted(last)
        key = {"id": lambda e: e, "last token": lambda e: (last[e], e), "pair count": lambda e: (count[e], e)}[rule]
        resident = set(order[-cap:])
        out.append(sum(e not in resident for e in need))
        order = [e for e in order if e not in last] + sorted(need, key=key)
    return out


def decode_hit_rate(streams: list[tuple[list[list[int]], list[list[int]]]], cap: int, rule: str) -> float:
    """streams: (prefill tokens, decode tokens) per layer or sequence; hit rate of the decode steps."""
    misses = refs = 0
    for prefill, decode in streams:
        m = lru_misses([prefill] + [[t] for t in decode], cap, rule)
        misses += sum(m[1:])
        refs += sum(len(set(t)) for t in decode)
    return 1 - misses / refs


def mixtral_prefill_decode(data: Path) -> list[tuple[list, list]]:
    by_layer = collections.defaultdict(list)
    for line in (data / "routing_mixtral8x7b" / "routing_raw.jsonl").read_text().splitlines():
        r = json.loads(line)
        by_layer[r["layer"]].append(r["experts"])
    return [(rows[:135], rows[135:]) for rows in by_layer.values()]  # token_pos 0..134 is the prompt


def flame_prefill_decode(data: Path) -> list[tuple[list, list]]:
    ids = np.load(data / "flame_moe_290m_dynande" / "flame290m_iter5473_32seq_x64tok_TxLxK.npz")["ids"]  # [32, 64, 8, 6]
    return [([list(ids[s, t, l]) for t in range(48)], [list(ids[s, t, l]) for t in range(48, 64)])
            for s in range(ids.shape[0]) for l in range(ids.shape[2])]


def mixtral_batched(data: Path, caps: list[int]) -> dict:
    streams = []
    for name in ("gsm8k_2_decode_TxLxK.npz", "humaneval_2_decode_TxLxK.npz"):
        z = np.load(data / "routing_mixtral8x7b" / name)
        streams += [z["p0_ids"], z["p1_ids"]]  # [T, 32, 2] each
    steps = min(len(s) for s in streams)
    out = {}
    for cap in caps:
        group = cap // 2
        result = {}
        for how in ("graph groups", "expert-major"):
            misses = 0
            for layer in range(32):
                seq = []
                for t in range(steps):
                    tokens = [[int(e) for e in s[t, layer] if e >= 0] for s in streams]
                    seq += [tokens[i : i + group] for i in range(0, 4, group)] if how == "graph groups" else [tokens]
                misses += sum(lru_misses(seq, cap))
            result[how] = round(misses / steps / 32, 3)
        out[f"C={cap}"] = result
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[3] / "shared" / "data"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    data = Path(args.data)
    results = {"after_a_wide_prefill_decode_hit_rate": {}, "batched_decode_B4_misses_per_layer_step": {}}
    for name, streams, caps in (("mixtral-8x7b raw", mixtral_prefill_decode(data), (2, 4, 6)),
                                ("flame-moe-290m", flame_prefill_decode(data), (8, 16, 32))):
        for cap in caps:
            rates = {rule: round(decode_hit_rate(streams, cap, rule), 4) for rule in RULES}
            results["after_a_wide_prefill_decode_hit_rate"][f"{name} C={cap}"] = rates
            print(f"{name:18} C={cap:<3} decode hit rate after the prefill: {rates}")
    batched = mixtral_batched(data, [2, 4, 6])
    results["batched_decode_B4_misses_per_layer_step"] = batched
    for cap, r in batched.items():
        print(f"mixtral-8x7b, 4 decode streams together, {cap}: misses per layer and step {r}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
