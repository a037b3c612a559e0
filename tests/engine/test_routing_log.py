"""RoutingLog: the device-side log of every step's routing equals what a host observer sees, step by step,
and a ring that wrapped drops only whole steps."""

from __future__ import annotations

import numpy as np
import torch

from wisp.config import EngineConfig
from wisp.engine.engine import LLMEngine
from wisp.engine.routing_log import RoutingLog
from wisp.engine.sampling import SamplingParams


class _Steps:
    """A host routing observer: each step's ids [T, L, K]."""

    def __init__(self, layers):
        self.layers, self.steps = list(layers), []

    def begin_step(self):
        self.steps.append({})

    def record(self, layer, topk_ids, topk_weights):
        self.steps[-1][layer] = topk_ids.cpu().numpy()

    def rows(self):
        return [np.stack([s[li] for li in self.layers], axis=1) for s in self.steps]


def test_the_log_holds_every_step_in_token_order(device, attention_backend):
    engine = LLMEngine(EngineConfig(model="demo", device=device, mode="paged", expert_cap=4, max_model_len=128,
                                    max_concurrency=2, max_num_batched_tokens=24, attention_backend=attention_backend))
    layers = list(engine.model.experts)
    log = RoutingLog(layers, engine.model_config.top_k, engine.device, capacity=512)
    engine.runner.set_routing_log(log)
    observer = _Steps(layers)
    engine.runner.add_routing_observer(observer)
    for j in range(3):
        engine.add_request(f"r{j}", [(5 * i + j) % 250 for i in range(30 + 7 * j)], SamplingParams(max_tokens=5, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    logged = log.drain()
    assert len(logged) == len(observer.steps) > 3
    assert all(np.array_equal(a, b) for a, b in zip(logged, observer.rows()))
    assert log.drain() == [] and log.lost == 0


def test_a_wrapped_ring_drops_whole_steps():
    log = RoutingLog([0, 1], top_k=2, device=torch.device("cpu"), capacity=8)
    steps = [torch.full((n, 2), i, dtype=torch.int64) for i, n in enumerate([3, 4, 2, 3])]  # 12 rows > 8
    for ids in steps:
        for layer in (0, 1):
            log.record(layer, ids)
    drained = log.drain()
    assert log.lost == 4  # rows of steps 0 and 1 overwritten; what was left of step 1 is dropped too
    assert [d[:, 0, 0].tolist() for d in drained] == [[2, 2], [3, 3, 3]]
    log.record(0, steps[0])
    log.record(1, steps[0])
    assert [d.shape for d in log.drain()] == [(3, 2, 2)]
