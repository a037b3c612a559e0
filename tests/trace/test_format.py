"""RoutingTrace: exact npz/JSONL round trips, step sets, validation, concatenation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wisp.core.experts.recency import touch_order
from wisp.trace import RoutingTrace

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def traces(draw):
    T, L, K = draw(st.integers(0, 12)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n = draw(st.integers(1, 9))
    flat = draw(st.lists(st.integers(-1, n - 1), min_size=T * L * K, max_size=T * L * K))
    ids = np.array(flat, dtype=np.int16).reshape(T, L, K)
    weights = None
    if draw(st.booleans()):
        weights = np.arange(T * L * K, dtype=np.float32).reshape(T, L, K) / 7
    step = None
    if draw(st.booleans()):
        step = np.cumsum(draw(st.lists(st.integers(0, 2), min_size=T, max_size=T)), dtype=np.int64)
    layers = draw(st.lists(st.integers(0, 40), min_size=L, max_size=L, unique=True))
    num_experts = draw(st.sampled_from([None, n]))
    return RoutingTrace(ids, weights, step, layers, num_experts, {"model": "m", "note": "x"})


def same_trace(a: RoutingTrace, b: RoutingTrace) -> None:
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.layers, b.layers)
    assert a.num_experts == b.num_experts and a.metadata.get("model") == b.metadata.get("model")
    assert (a.weights is None) == (b.weights is None)
    if a.weights is not None:
        np.testing.assert_array_equal(a.weights, b.weights)
    for layer in a.layers.tolist():
        assert a.steps(layer) == b.steps(layer)


@SETTINGS
@given(traces())
def test_npz_and_jsonl_round_trips_are_exact(tmp_path, tr):
    for name in ("t.npz", "t.jsonl"):
        tr.save(tmp_path / name)
        back = RoutingTrace.load(tmp_path / name)
        same_trace(tr, back)
        if name.endswith(".npz"):
            assert (back.step is None) == (tr.step is None)
            assert back.ids.dtype == np.int16 and back.layers.dtype == np.int32


@SETTINGS
@given(traces())
def test_steps_are_distinct_sets_in_touch_order(tr):
    for layer in tr.layers.tolist():
        steps = tr.steps(layer)
        per_token = tr.steps(layer, per_token=True)
        assert len(per_token) == tr.num_tokens
        if tr.step is None:
            assert steps == per_token
        else:
            assert len(steps) == len(np.unique(tr.step))
            # a step's set is the union of its tokens' sets
            bounds = np.flatnonzero(np.diff(tr.step)) + 1
            starts = [0, *bounds.tolist()]
            ends = [*bounds.tolist(), tr.num_tokens]
            col = tr.ids[:, tr.layer_position(layer), :]
            for s, a, b in zip(steps, starts, ends):
                assert sorted(s) == sorted(set().union(*[set(x) for x in per_token[a:b]]))
                assert s == touch_order(col[a:b].tolist())
        for s in steps:
            assert len(s) == len(set(s)) and all(0 <= e < tr.num_experts for e in s)


def test_steps_by_hand_and_num_experts():
    ids = np.array([[[3, -1]], [[3, 1]], [[-1, -1]], [[0, 2]]], dtype=np.int16)  # T=4, L=1, K=2
    tr = RoutingTrace(ids, layers=[5])
    assert tr.steps(5) == [[3], [1, 3], [], [0, 2]]
    assert tr.num_experts == 4
    assert RoutingTrace(ids, step=[0, 0, 1, 1], layers=[5], num_experts=8).steps(5) == [[1, 3], [0, 2]]
    # a multi-token step lists its experts by the last token routing to each, then id
    two = np.array([[[2, 0]], [[5, 1]]], dtype=np.int16)
    assert RoutingTrace(two, step=[0, 0], layers=[5]).steps(5) == [[0, 2, 1, 5]]
    with pytest.raises(ValueError):
        tr.steps(0)  # 0 is not one of the trace's MoE layers


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ids": np.zeros((2, 2), dtype=np.int16)},
        {"ids": np.full((1, 1, 1), -2)},
        {"ids": np.full((1, 1, 1), 5), "num_experts": 5},
        {"ids": np.zeros((2, 1, 1)), "step": [1, 0]},
        {"ids": np.zeros((2, 1, 1)), "step": [0]},
        {"ids": np.zeros((1, 2, 1)), "layers": [3, 3]},
        {"ids": np.zeros((1, 1, 2)), "weights": np.zeros((1, 1, 1))},
        {"ids": np.full((1, 1, 1), 40000)},
        {"ids": np.zeros((3, 1, 1)), "metadata": {"sequence_lengths": [1, 1]}},  # not all T tokens
        {"ids": np.zeros((3, 1, 1)), "metadata": {"sequence_lengths": [3, 0]}},  # an empty sequence
    ],
)
def test_invalid_traces_are_refused(kwargs):
    with pytest.raises(ValueError):
        RoutingTrace(**kwargs)


def test_jsonl_without_token_field(tmp_path):
    """The i-th line of a (step, layer) pair is the step's i-th token; ids may be short."""
    lines = [
        {"meta": {"model": "m", "num_experts": 6}},
        {"step": 7, "layer": 2, "ids": [1, 2], "weights": [0.5, 0.5]},
        {"step": 7, "layer": 4, "ids": [3]},
        {"step": 7, "layer": 2, "ids": [4, 5]},
        {"step": 3, "layer": 4, "ids": [0, 1]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    tr = RoutingTrace.load(path)
    assert tr.layers.tolist() == [2, 4] and tr.num_experts == 6 and tr.num_tokens == 3
    assert tr.step.tolist() == [3, 7, 7]
    assert tr.steps(2) == [[], [1, 2, 4, 5]] and tr.steps(4) == [[0, 1], [3]]
    assert tr.ids[1].tolist() == [[1, 2], [3, -1]]
    assert tr.weights[1, 0].tolist() == [0.5, 0.5] and np.isnan(tr.weights[2, 1]).all()
    path.write_text(json.dumps({"layer": 0, "ids": [1]}) + "\n")
    with pytest.raises(ValueError):
        RoutingTrace.load(path)


def test_concat_keeps_steps_distinct():
    a = RoutingTrace(np.array([[[0]], [[1]]]), step=[4, 4], num_experts=3)
    b = RoutingTrace(np.array([[[2]], [[1]]]))
    c = RoutingTrace.concat([a, b])
    assert c.steps(0) == [[0, 1], [2], [1]] and c.num_experts == 3
    assert RoutingTrace.concat([b, b]).step is None and RoutingTrace.concat([b, b]).steps(0) == [[2], [1]] * 2
    with pytest.raises(ValueError):
        RoutingTrace.concat([a, RoutingTrace(np.zeros((1, 2, 1)))])


def test_sequences_are_kept_by_concat_and_files_and_cut_in_order(tmp_path):
    a = RoutingTrace(np.array([[[0]], [[1]]]), step=[4, 4], num_experts=3)
    b = RoutingTrace(np.array([[[2]], [[1]], [[0]]]))
    assert a.sequence_lengths == [2] and RoutingTrace(np.zeros((0, 1, 1))).sequence_lengths == []
    ab = RoutingTrace.concat([a, b])
    abab = RoutingTrace.concat([ab, ab])
    assert ab.sequence_lengths == [2, 3] and abab.sequence_lengths == [2, 3, 2, 3]
    cut = abab.sequences()
    assert [s.ids[:, 0, 0].tolist() for s in cut] == [[0, 1], [2, 1, 0]] * 2
    assert cut[0].step.tolist() == [4, 4] and cut[1].step.tolist() == [5, 6, 7] and cut[0].num_experts == 3
    for name in ("t.npz", "t.jsonl"):
        abab.save(tmp_path / name)
        assert RoutingTrace.load(tmp_path / name).sequence_lengths == [2, 3, 2, 3]


@SETTINGS
@given(traces(), st.integers(1, 5))
def test_replayed_over_more_layers_shifts_each_layer(tr, n):
    """Model layer i routes as trace layer i % L, i * T // n tokens later (cyclically); every token its own step."""
    layers = [10 + 2 * i for i in range(n)]
    out = tr.replayed_over(layers)
    T, L = tr.num_tokens, tr.num_layers
    assert out.ids.shape == (T, n, tr.top_k) and out.layers.tolist() == layers and out.step is None
    assert out.num_experts == tr.num_experts and "approximation" in out.metadata["note"]
    for i in range(n):
        shift = i * T // n if T else 0
        assert np.array_equal(out.ids[:, i], np.roll(tr.ids[:, i % L], -shift, axis=0))
        if tr.weights is not None:
            np.testing.assert_array_equal(out.weights[:, i], np.roll(tr.weights[:, i % L], -shift, axis=0))
    assert (out.weights is None) == (tr.weights is None)
