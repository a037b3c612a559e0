"""The routing recorder: a recorded trace replays to exactly the pager's live counters."""

from __future__ import annotations

import pytest

from wisp import LLM, SamplingParams
from wisp.plan.miss_curves import expert_miss_curve
from wisp.trace.format import RoutingTrace
from wisp.trace.recorder import RoutingRecorder


LONG = "a prompt long enough that its prefill routes to more experts than the slots hold"


@pytest.mark.slow
@pytest.mark.parametrize("cap, prompts", [(4, ["h"]), (6, ["h"]), (8, ["a", "b"]), (12, ["a", "b", "c"]),
                                          (4, [LONG]), (6, [LONG, "b"])])
def test_recorded_trace_predicts_the_live_misses_exactly(cap, prompts, tmp_path):
    """Also for wide steps (a prefill routing to more than C experts, run expert-major as one step)."""
    llm = LLM("demo", device="cpu", mode="paged", expert_cap=cap)
    recorder = RoutingRecorder(llm.config.moe_layer_ids, llm.config.num_experts, "demo").attach(llm.engine)
    llm.generate(prompts, SamplingParams(max_tokens=25, ignore_eos=True))
    trace = recorder.trace()
    assert trace.num_tokens == sum(len(llm.encode(p)) for p in prompts) + 24 * len(prompts)
    assert list(trace.layers) == llm.config.moe_layer_ids and trace.top_k == llm.config.top_k
    predicted = sum(expert_miss_curve(trace.steps(layer), llm.config.num_experts)[cap] for layer in trace.layers)
    assert predicted == llm.stats()["expert_misses"] > 0
    widest = max(len(set(step)) for layer in trace.layers for step in trace.steps(layer))
    assert (widest > cap) == (LONG in prompts)
    trace.save(tmp_path / "t.npz")
    again = RoutingTrace.load(tmp_path / "t.npz")
    assert (again.ids == trace.ids).all() and (again.step == trace.step).all()
