"""The plug-in's counters equal wisp's own engine on the same prompts, caps and routing, on the CPU.

What is compared, per MoE layer: hits, misses, evictions, loads, bytes_h2d and steps of vLLM with the plug-in and of
wisp's `LLM` (mode "paged", the same per-layer caps, eager, bfloat16) over the same two prompts, run one request at a
time (vLLM: max_num_seqs 1, no chunked prefill; wisp: max_concurrency 1), so that every engine step of either is one
prompt's whole prefill or one decode token.

The routing is made equal by construction: vLLM's is recorded (the ids each paged layer's step receives) and wisp's
engine replays it whole (`WholeRequestReplay`: every token of request i, prompt included, routes as position p of
vLLM's request i). Left to their own numerics the two engines route alike on most tokens but not all (bfloat16
with different attention and MoE kernels; on this model one decode token of the second prompt picks another
second expert). wisp's routing as its engine then saw it (`RoutingRecorder`) must equal vLLM's step for step: that
checks the step boundaries align. Equal counters then mean that the plug-in pages as wisp's engine pages (recency,
wide prefill steps, what a load costs), from the same start (empty slots: vLLM's counters are checked to be zero
before the prompts, so no warm-up ran through the pager). The tokens are not compared (both engines' byte identity
is tested elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # each LLM takes seconds to build

from tests.integrations.vllm import test_vllm_offline  # noqa: E402
from tests.integrations.vllm.plans import tiny_plan  # noqa: E402
from tests.integrations.vllm.registered import wisp_registered  # noqa: E402
from tests.integrations.vllm.test_vllm_offline import make_llm, tiny_bf16_checkpoint  # noqa: E402
from wisp.integrations.vllm import layer_counters  # noqa: E402
from wisp.integrations.vllm.settings import layer_index_of  # noqa: E402
from wisp.models.config_parsers import read_model_config  # noqa: E402
from wisp.plan.plan_file import write_plan  # noqa: E402
from wisp.trace.replay_buffer import ReplayBuffer  # noqa: E402

vllm_env = test_vllm_offline.vllm_env  # its environment fixture (one process, the CPU settings), shared

PROMPTS = [[1, 5, 9, 22, 7, 3], [4, 8, 15, 16, 23, 42, 99, 17, 60]]
MAX_TOKENS = 8
COUNTED = ("hits", "misses", "evictions", "loads", "bytes_h2d", "steps")
ROUTED: dict[int, list[np.ndarray]] = {}  # vLLM: decoder layer -> each step's routed ids [T, K]


@pytest.fixture(scope="module")
def qwen3_moe(vllm_env, tmp_path_factory):
    with wisp_registered():
        yield tiny_bf16_checkpoint("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


class WholeRequestReplay(ReplayBuffer):
    """Routes token p of the i-th request wisp's engine sees, prompt tokens included, as row p of recorded
    sequence i (wisp's `RoutingReplay` keeps the router's choice for prompt tokens)."""

    def __init__(self, sequences: list[np.ndarray], cfg):
        super().__init__(sequences, cfg.moe_layer_ids, cfg.num_experts, cfg.top_k, torch.device("cpu"), max_rows=64)
        self.sequence_of: dict[str, int] = {}

    def advance(self, batch) -> None:
        def rows_of(seq, positions):
            return self.starts[self.sequence_of.setdefault(seq.request_id, len(self.sequence_of))] + positions

        self.load(self.token_rows(batch, rows_of))


def requests_routing(steps: dict[int, list[np.ndarray]]) -> list[np.ndarray]:
    """vLLM's recorded steps (one request at a time, MAX_TOKENS steps each) as one [T, L, K] sequence per request."""
    layers = sorted(steps)
    return [np.stack([np.concatenate(steps[layer][r * MAX_TOKENS:(r + 1) * MAX_TOKENS]) for layer in layers], axis=1)
            for r in range(len(PROMPTS))]


def wisp_engine_run(path, caps: tuple[int, ...], routing: list[np.ndarray]):
    """({MoE layer: its steps' routed ids}, {MoE layer: counters}) of wisp's own engine replaying `routing`."""
    import wisp
    from wisp.trace.recorder import RoutingRecorder

    llm = wisp.LLM(str(path), device="cpu", mode="paged", dtype="bfloat16", per_layer_caps=caps, max_concurrency=1,
                   max_model_len=128)
    llm.engine.runner.set_routing_replay(WholeRequestReplay(routing, llm.config))
    recorder = RoutingRecorder(llm.config.moe_layer_ids, llm.config.num_experts).attach(llm.engine)
    llm.generate(PROMPTS, wisp.SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    recorder.detach(llm.engine)
    trace = recorder.trace()
    steps = {int(layer): [np.sort(trace.ids[trace.step == s, i], axis=1) for s in np.unique(trace.step)]
             for i, layer in enumerate(trace.layers)}
    counters = {int(layer): {k: c[k] for k in COUNTED} for layer, c in llm.stats()["per_layer"].items()}
    return steps, counters


def record_routing(model) -> None:
    """Wrap each paged layer's step so that it logs the ids vLLM routed into ROUTED (one process: run through
    `llm.apply_model`)."""
    for name, module in model.named_modules():
        paging = getattr(getattr(module, "quant_method", None), "wisp_paging", None)
        if paging is not None:
            steps = ROUTED.setdefault(layer_index_of(name), [])

            def step(topk_ids, _step=paging.step, _steps=steps):
                _steps.append(topk_ids.numpy().copy())
                return _step(topk_ids)

            paging.step = step


def vllm_run(path, additional_config):
    """({MoE layer: its steps' routed ids}, {MoE layer: counters}) of vLLM with the plug-in."""
    llm = make_llm(path, additional_config, max_num_seqs=1, enable_chunked_prefill=False)
    assert all(c[k] == 0 for c in llm.apply_model(layer_counters)[0].values() for k in COUNTED)
    ROUTED.clear()
    llm.apply_model(record_routing)
    params = vllm.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    counters = {layer_index_of(name): {k: c[k] for k in COUNTED} for name, c in llm.apply_model(layer_counters)[0].items()}
    return dict(ROUTED), counters


@pytest.mark.parametrize("caps", [(2, 2), (2, 5)])
def test_the_plugins_counters_equal_wisps_engine_on_the_same_routing(qwen3_moe, tmp_path, caps):
    """(2, 2): one cap for both layers (`expert_cap`); (2, 5): a plan's per-layer caps (`plan`)."""
    if len(set(caps)) == 1:
        config = {"wisp": {"mode": "paged", "expert_cap": caps[0]}}
    else:
        plan = tiny_plan(read_model_config(qwen3_moe), slots=5, max_concurrency=4, max_model_len=128, caps=caps)
        write_plan(plan, tmp_path / "plan.json")
        config = {"wisp": {"plan": str(tmp_path / "plan.json")}}
    vllm_steps, vllm_counters = vllm_run(qwen3_moe, config)
    assert sorted(vllm_steps) == [0, 2] and all(len(s) == len(PROMPTS) * MAX_TOKENS for s in vllm_steps.values())
    wisp_steps, wisp_counters = wisp_engine_run(qwen3_moe, caps, requests_routing(vllm_steps))
    for layer, steps in vllm_steps.items():  # each prompt: its whole prefill, then 7 decode tokens, in both
        assert [np.sort(s, axis=1).tolist() for s in steps] == [s.tolist() for s in wisp_steps[layer]]
    assert vllm_counters == wisp_counters
    assert all(c["evictions"] > 0 and c["hits"] > 0 for c in wisp_counters.values())  # the slots turned over
