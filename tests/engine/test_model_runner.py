"""ModelRunner's extension points: routing observers (registered, told of each step, removed by their
handle) and a routing replay (its choices used in place of the router's)."""

from __future__ import annotations

import numpy as np

from wisp import LLM, SamplingParams
from wisp.trace.format import RoutingTrace
from wisp.trace.replay import RoutingReplay


class Counting:
    def __init__(self):
        self.steps, self.calls, self.experts, self.per_step = 0, 0, set(), []

    def begin_step(self) -> None:
        self.steps += 1
        self.per_step.append(set())

    def record(self, layer, topk_ids, topk_weights) -> None:
        self.calls += 1
        self.experts |= set(topk_ids.reshape(-1).tolist())
        self.per_step[-1] |= set(topk_ids.reshape(-1).tolist())


def test_observers_see_every_step_until_removed():
    llm = LLM("demo", device="cpu", mode="paged", expert_cap=4)
    runner, layers = llm.engine.runner, len(llm.config.moe_layer_ids)
    a, b = Counting(), Counting()
    handle_a, handle_b = runner.add_routing_observer(a), runner.add_routing_observer(b)
    llm.generate(["hi"], SamplingParams(max_tokens=5, ignore_eos=True))
    assert a.steps == b.steps == 5 and a.calls == b.calls == 5 * layers
    handle_a.remove()
    handle_a.remove()  # again: nothing
    llm.generate(["hi"], SamplingParams(max_tokens=3, ignore_eos=True))
    assert a.steps == 5 and b.steps == 8
    handle_b.remove()
    assert llm.model.routing_hook is None and not runner.observers


def test_a_replay_routes_decode_to_the_recorded_experts():
    llm = LLM("demo", device="cpu", mode="paged", expert_cap=4)
    cfg = llm.config
    ids = np.tile(np.arange(cfg.top_k, dtype=np.int16), (6, len(cfg.moe_layer_ids), 1))  # experts 0..K-1 always
    trace = RoutingTrace(ids, np.ones(ids.shape, np.float32), np.arange(6, dtype=np.int32), cfg.moe_layer_ids,
                         cfg.num_experts, {})
    replay = RoutingReplay(trace, cfg.moe_layer_ids, cfg.num_experts, cfg.top_k, llm.engine.device, 64)
    llm.engine.runner.set_routing_replay(replay)
    seen = Counting()
    llm.engine.runner.add_routing_observer(seen)
    replay.active = True
    llm.generate(["hi"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert seen.steps == 4 and len(replay.sequence_of) == 1  # the prefill (the router's), then 3 decode steps
    assert all(experts == set(range(cfg.top_k)) for experts in seen.per_step[1:])
    llm.engine.runner.set_routing_replay(None)
    assert llm.model.routing_override is None
