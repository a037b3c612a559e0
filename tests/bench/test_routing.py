"""wisp.bench.routing: the uniform trace and the labels every benchmark record carries."""

from __future__ import annotations

import numpy as np

from wisp.bench.routing import routing_for, uniform_trace
from wisp.models.config_parsers import model_config
from wisp.models.demo import DEMO_CONFIG
from wisp.trace.format import RoutingTrace


def test_the_uniform_trace_draws_distinct_experts_per_token_and_layer():
    cfg = model_config(DEMO_CONFIG)
    trace = uniform_trace(cfg, 2100)  # spans three 1024-row draws
    ids = trace.ids
    assert ids.shape == (2100, len(cfg.moe_layer_ids), cfg.top_k) and trace.num_experts == cfg.num_experts
    assert all(len(set(row)) == cfg.top_k for row in ids.reshape(-1, cfg.top_k).tolist())
    counts = np.bincount(ids.ravel(), minlength=cfg.num_experts)  # every expert drawn about equally often
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()
    assert not np.array_equal(ids[:1024], ids[1024:2048])  # the chunks are not one draw repeated
    assert np.array_equal(uniform_trace(cfg, 2100).ids, ids)  # seeded


def test_the_uniform_trace_draws_each_requests_sequence_with_its_own_seed():
    cfg = model_config(DEMO_CONFIG)
    one, three = uniform_trace(cfg, 16), uniform_trace(cfg, 16, sequences=3)
    assert three.sequence_lengths == [16] * 3 and one.sequence_lengths == [16]
    cut = three.sequences()
    assert np.array_equal(cut[0].ids, one.ids)  # sequence 0: seed 0, as a one-stream trace
    assert not np.array_equal(cut[1].ids, cut[0].ids) and not np.array_equal(cut[2].ids, cut[1].ids)


def test_routing_labels_say_what_was_replayed(tmp_path):
    cfg = model_config(DEMO_CONFIG)
    assert routing_for(None, cfg) == (None, "random-router")
    assert routing_for("uniform", cfg, 64)[1] == "uniform-iid"
    trace, label = routing_for("uniform", cfg, 64, requests=4)
    assert label == "uniform-iid-per-request" and trace.sequence_lengths == [64] * 4
    one_layer = tmp_path / "l0.npz"
    RoutingTrace(np.tile(np.arange(cfg.top_k, dtype=np.int16), (8, 1, 1)), layers=[0],
                 metadata={"num_experts": cfg.num_experts}).save(one_layer)
    trace, label = routing_for(str(one_layer), cfg)
    assert label == "approx-layer0:l0.npz" and trace.ids.shape == (8, len(cfg.moe_layer_ids), cfg.top_k)
    layer3 = tmp_path / "l3.npz"
    RoutingTrace(np.tile(np.arange(cfg.top_k, dtype=np.int16), (8, 1, 1)), layers=[3],
                 metadata={"num_experts": cfg.num_experts}).save(layer3)
    assert routing_for(str(layer3), cfg)[1] == "approx-layer3:l3.npz"
    every = tmp_path / "all.npz"
    uniform_trace(cfg, 8).save(every)
    trace, label = routing_for(str(every), cfg)
    assert label == "replay:all.npz" and np.array_equal(trace.ids, uniform_trace(cfg, 8).ids)
    assert routing_for(str(every), cfg, requests=2)[1] == "replay-per-request:all.npz"
    assert routing_for(str(layer3), cfg, requests=2)[1] == "approx-layer3-per-request:l3.npz"
