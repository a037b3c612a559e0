"""Readers of other projects' traces: synthetic files in each layout, then the shared real traces
(skipped when ../shared/data is absent; it is never copied into the repo)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wisp.trace import RoutingTrace
from wisp.trace.readers import (
    load_any,
    read_flame_npz,
    read_mixtral_jsonl,
    read_mixtral_npz,
    read_vllm_layer_log,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"  # tests/trace/x.py -> repo -> its parent


def shared(rel: str) -> Path:
    path = DATA / rel
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    return path


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- synthetic files --------------------------------------------------------------------------------
def test_vllm_log_skips_dummies_drops_repeated_profile_and_finds_passes(tmp_path):
    dummy = lambda i: {"type": "route", "req_id": "r", "token_idx": i, "layer": 0, "topk_ids": [3, 1],
                       "topk_weights": [0.5, 0.5]}
    real = lambda i, ids: {"type": "route", "req_id": "r", "token_idx": i, "layer": 0, "topk_ids": ids,
                           "topk_weights": [0.7, 0.3]}
    rows = [{"type": "meta", "model_id": "toy", "top_k": 2, "num_experts": 6}]
    rows += [dummy(i) for i in range(4)]
    rows += [real(0, [0, 1]), real(1, [2, 3]), real(0, [4, 5])]  # two passes
    rows += [dummy(i) for i in range(4)]  # a second profiling pass
    rows += [real(0, [5, 0])]
    tr = read_vllm_layer_log(write_jsonl(tmp_path / "toy_layer0.jsonl", rows), skip_rows=4)
    assert tr.num_experts == 6 and tr.num_tokens == 4 and tr.layers.tolist() == [0]
    assert tr.steps(0) == [[0, 1, 2, 3], [4, 5], [0, 5]]
    assert "1 repeated" in tr.metadata["note"]
    kept = read_vllm_layer_log(tmp_path / "toy_layer0.jsonl", skip_rows=4, drop_repeat_profiles=False)
    assert kept.num_tokens == 8
    # a log whose token_idx only grows has no pass boundaries: per-token steps
    mono = [rows[0]] + [real(i, [i % 6, (i + 1) % 6]) for i in range(5)]
    assert read_vllm_layer_log(write_jsonl(tmp_path / "mono.jsonl", mono)).step is None
    with pytest.raises(ValueError):
        read_vllm_layer_log(write_jsonl(tmp_path / "anon.jsonl", [real(0, [1, 2])]))  # unknown model, no N


def test_mixtral_jsonl_fills_missing_cells(tmp_path):
    rec = lambda p, t, l, e: {"dataset": "d", "problem_id": p, "layer": l, "experts": e,
                              "gating_probs": [0.6, 0.4], "token_idx": t}
    rows = [rec(0, 0, 0, [1, 2]), rec(0, 0, 1, [3, 4]), rec(0, 1, 1, [5, 6]), rec(7, 0, 0, [0, 7])]
    traces = read_mixtral_jsonl(write_jsonl(tmp_path / "x_routing.jsonl", rows))
    assert [t.num_tokens for t in traces] == [2, 1]
    assert traces[0].ids[1, 0].tolist() == [-1, -1] and traces[0].steps(1) == [[3, 4], [5, 6]]
    assert traces[1].num_experts == 8 and traces[1].num_layers == 2  # layers are shared by all problems
    assert load_any(tmp_path / "x_routing.jsonl").num_tokens == 3


def test_synthetic_npz_layouts_and_dispatch(tmp_path):
    ids = np.arange(2 * 3 * 2 * 2, dtype=np.int16).reshape(2, 3, 2, 2) % 64
    np.savez(tmp_path / "flame_toy.npz", ids=ids, weights=ids.astype(np.float32), moe_layers=np.array([4, 5]))
    fl = read_flame_npz(tmp_path / "flame_toy.npz")
    assert fl.num_tokens == 6 and fl.layers.tolist() == [4, 5] and fl.num_experts == 64
    assert fl.sequence_lengths == [3, 3] and np.array_equal(fl.sequences()[1].ids, ids[1])
    assert fl.steps(5)[4] == sorted(set(ids[1, 1, 1].tolist()))
    assert len(read_flame_npz(tmp_path / "flame_toy.npz", step_per_sequence=True).steps(4)) == 2
    mx = np.zeros((3, 32, 2), dtype=np.int16)
    np.savez(tmp_path / "toy_decode_TxLxK.npz", p0_ids=mx, p1_ids=mx[:1], p0_weights=mx.astype(np.float32))
    assert [t.num_tokens for t in read_mixtral_npz(tmp_path / "toy_decode_TxLxK.npz")] == [3, 1]
    assert load_any(tmp_path / "toy_decode_TxLxK.npz").sequence_lengths == [3, 1]  # a problem, a sequence
    RoutingTrace(np.ones((2, 1, 1)), num_experts=3).save(tmp_path / "ours.npz")
    assert load_any(tmp_path / "ours.npz").num_experts == 3
    with pytest.raises(ValueError):
        load_any(tmp_path / "nothing.csv")


# -- the shared real traces -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["humaneval_2", "gsm8k_2"])
def test_mixtral_npz_equals_jsonl(name):
    npz = read_mixtral_npz(shared(f"routing_mixtral8x7b/{name}_decode_TxLxK.npz"))
    jsl = read_mixtral_jsonl(shared(f"routing_mixtral8x7b/{name}_routing.jsonl"))
    assert len(npz) == len(jsl) == 2
    for a, b in zip(npz, jsl):
        assert a.ids.shape == b.ids.shape and a.ids.shape[1:] == (32, 2)
        assert np.array_equal(a.ids, b.ids)
        ok = a.ids >= 0
        np.testing.assert_allclose(a.weights[ok], b.weights[ok], rtol=1e-6)
        assert a.num_experts == 8


def test_mixtral_shapes_and_missing_cells():
    lengths, missing = [], 0
    for name in ("humaneval_2", "gsm8k_2"):
        for t in read_mixtral_npz(shared(f"routing_mixtral8x7b/{name}_decode_TxLxK.npz")):
            lengths.append(t.num_tokens)
            missing += int(np.all(t.ids < 0, axis=2).sum())
            assert np.all(np.any(t.ids < 0, axis=2) == np.all(t.ids < 0, axis=2))  # a cell is whole or gone
    assert lengths == [83, 255, 168, 79] and missing == 52  # README: 52 of 18,720 cells missing
    assert load_any(shared("routing_mixtral8x7b/humaneval_2_routing.jsonl")).sequence_lengths == [83, 255]


def test_flame():
    tr = load_any(shared("flame_moe_290m_dynande/flame290m_iter5473_32seq_x64tok_TxLxK.npz"))
    assert (tr.num_tokens, tr.num_layers, tr.top_k, tr.num_experts) == (2048, 8, 6, 64)
    assert tr.layers.tolist() == list(range(2, 10)) and tr.step is None and tr.sequence_lengths == [64] * 32
    assert tr.ids[0, 0].tolist() == [34, 28, 21, 47, 3, 12]  # the HF dataset card's example row
    assert all(len(s) == 6 for s in tr.steps(2))


def test_olmoe_layer0():
    tr = load_any(shared("layer0_only_vllm_logs/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl"))
    assert (tr.num_tokens, tr.top_k, tr.num_experts, tr.layers.tolist()) == (4471, 8, 64, [0])
    assert tr.step is None  # token_idx is a global counter in this log: no pass boundaries
    assert not np.any(np.all(np.isclose(tr.weights, 0.125), axis=2)), "a profiling dummy row survived"
    assert all(len(s) == 8 for s in tr.steps(0))


def test_qwen_layer0_drops_the_second_profiling_pass():
    tr = load_any(shared("layer0_only_vllm_logs/qwen15moe_a27b_layer0_gsm8k_TotaniYash.jsonl"))
    # 10,626 rows follow the first 8192 dummies, but 8192 of them are an identical second profiling pass
    assert (tr.num_tokens, tr.top_k, tr.num_experts) == (2434, 4, 60)
    dummy = np.array([43, 5, 7, 58])
    assert not np.any(np.all(tr.ids[:, 0] == dummy, axis=1) & np.isclose(tr.weights[:, 0, 0], 0.0967))
    steps = tr.steps(0)
    assert len(steps) == 104 and max(len(s) for s in steps) <= 60
    assert len(tr.steps(0, per_token=True)) == 2434
