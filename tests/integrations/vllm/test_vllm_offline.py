"""wisp's paging inside vLLM's offline `LLM`, end to end on the CPU (skipped where vllm is not installed: it lives in a
virtual environment of its own, docs/vllm.md).

One process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the "uni" executor). The baselines (eager and torch.compile'd)
run with no plug-in loaded (`VLLM_PLUGINS=""`); the module then registers wisp's method as the entry point would,
and every paged run must give its baseline's greedy tokens and top-5 logprobs exactly, at C = top_k, N/2 and N.
"""

from __future__ import annotations

import os
from functools import partial

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # each LLM takes seconds to build

from tests.integrations.vllm.checkpoints import HEADS_32, tiny_bf16_checkpoint  # noqa: E402

N, TOP_K = 8, 2
EXPERT_BYTES = (2 * 32 * 64 + 64 * 32) * 2  # one expert's gate_up [64, 64] and down [64, 32] in bf16
PROMPTS = [[1, 5, 9, 22, 7, 3], [4, 8, 15, 16, 23, 42, 99, 17, 60], [120, 2, 77, 31]]
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
       "VLLM_PLUGINS": ""}


@pytest.fixture(scope="module")
def vllm_env(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in [*ENV, "VLLM_CACHE_ROOT"]}
    os.environ.update(ENV, VLLM_CACHE_ROOT=str(tmp_path_factory.mktemp("vllm_cache")))
    yield
    from wisp.integrations.vllm.moe_method import PROCESS_COUNTERS

    PROCESS_COUNTERS.clear()  # no exit log line for these runs: pytest has closed vLLM's log stream by then
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {family: tiny_bf16_checkpoint(family, tmp_path_factory.mktemp(family)) for family in HEADS_32}


@pytest.fixture(scope="module")
def qwen3_moe(checkpoints):
    """Qwen3-MoE with layer 1 dense: layers 0 and 2 are MoE."""
    return checkpoints["qwen3_moe"]


def make_llm(path, additional_config=None, eager=True, **options):
    """One process's vLLM over a tiny checkpoint; `options`: other vLLM engine arguments, or these replaced."""
    options = {"max_model_len": 128, "max_num_seqs": 4, **options}
    return vllm.LLM(str(path), skip_tokenizer_init=True, enforce_eager=eager, distributed_executor_backend="uni",
                    dtype="bfloat16", seed=0, additional_config=additional_config or {}, **options)


def greedy(llm):
    """Per prompt: (the 8 greedy tokens, each step's top-5 {token: logprob}), and the paged layers' counters."""
    from vllm.inputs import TokensPrompt

    from wisp.integrations.vllm import layer_counters

    params = vllm.SamplingParams(max_tokens=8, temperature=0.0, logprobs=5, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    tokens = [(list(o.outputs[0].token_ids), [{t: lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs])
              for o in outs]
    return tokens, llm.apply_model(layer_counters)[0]


FAMILIES = ("qwen3_moe", "olmoe", "mixtral")


@pytest.fixture(scope="module")
def baselines(vllm_env, checkpoints):
    """{(family, eager): outputs} of vLLM with no plug-in loaded, eager and torch.compile'd; then wisp's method is
    registered for the rest of the module."""
    from vllm.model_executor.custom_op import op_registry_oot

    from wisp.integrations.vllm import register

    assert "UnquantizedFusedMoEMethod" not in op_registry_oot
    found = {}
    for family in FAMILIES:
        for eager in (True, False):
            found[family, eager], counters = greedy(make_llm(checkpoints[family], eager=eager))
            assert counters == {}
    register()
    register()  # vLLM may load plug-ins more than once per process
    return found


@pytest.fixture(scope="module")
def baseline(baselines):
    return baselines["qwen3_moe", True]


def counted_since(before: dict, now: dict) -> dict:
    """Per layer, the counts added since `before` (and the layer's slots now)."""
    return {layer: {key: v if key == "slots" else v - before.get(layer, {}).get(key, 0) for key, v in c.items()}
            for layer, c in now.items()}


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
@pytest.mark.parametrize("family", FAMILIES)
def test_paged_runs_give_vllms_tokens_and_logprobs_at_every_cap(baselines, checkpoints, family, eager):
    """One LLM per family, eager and compiled (torch.compile traces vLLM's CPU MoE layer; wisp's opaque op keeps
    the graph whole around the decision), at C = top_k, then resized between requests to N / 2 and N: every run
    gives vLLM's own tokens and top-5 logprobs. Prefix caching is off so that every run recomputes its prompts."""
    from wisp.integrations.vllm import layer_counters, resize_slots

    llm = make_llm(checkpoints[family], {"wisp": {"mode": "paged", "expert_cap": TOP_K}}, eager=eager,
                   enable_prefix_caching=False)
    before: dict = {}
    for cap in (TOP_K, N // 2, N):
        if cap != TOP_K:
            assert set(llm.apply_model(partial(resize_slots, expert_cap=cap))[0].values()) == {cap}
        out, now = greedy(llm)
        assert out == baselines[family, eager], cap
        counters, before = counted_since(before, now), now
        assert len(counters) == 2  # Qwen3-MoE: layers 0 and 2 (1 is dense); OLMoE and Mixtral: both layers
        for c in counters.values():
            assert c["slots"] == cap
            assert c["steps"] > 0 and c["hits"] > 0 and c["bytes_h2d"] == c["loads"] * EXPERT_BYTES
            if cap < N:
                assert c["misses"] > N and c["evictions"] > 0  # more than the cold misses: the slots turn over
            else:
                assert c["misses"] <= N and c["evictions"] == 0 and c["wide_steps"] == 0
            if cap == TOP_K:
                assert c["wide_steps"] > 0  # the batched prefill routes to more than C
    with pytest.raises(Exception, match="below the model's top_k 2"):  # refused whole: no layer changes
        llm.apply_model(partial(resize_slots, expert_cap=1))
    assert {c["slots"] for c in llm.apply_model(layer_counters)[0].values()} == {N}


def test_without_a_wisp_table_the_method_is_vllms(baseline, qwen3_moe):
    out, counters = greedy(make_llm(qwen3_moe))
    assert out == baseline and counters == {}


def test_per_layer_caps_page_only_the_named_layers(baseline, qwen3_moe):
    out, counters = greedy(make_llm(qwen3_moe, {"wisp": {"mode": "paged", "expert_cap": {"2": TOP_K}}}))
    assert out == baseline and list(counters) == ["model.layers.2.mlp.experts.routed_experts"]


@pytest.mark.parametrize("table, message", [
    ({"mode": "paged", "expert_cap": 1}, "below the model's top_k 2"),
    ({"mode": "zero-copy", "expert_cap": 4}, "unknown wisp mode 'zero-copy'"),
])
def test_bad_settings_stop_vllm_with_one_clear_error(baseline, qwen3_moe, table, message):
    with pytest.raises(Exception, match=message):
        make_llm(qwen3_moe, {"wisp": table})


def test_an_unsupported_vllm_is_left_untouched(baseline, monkeypatch, caplog):
    from vllm.model_executor.custom_op import op_registry_oot

    from wisp.integrations.vllm import register

    before = dict(op_registry_oot)
    op_registry_oot.pop("UnquantizedFusedMoEMethod")
    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    try:
        register()
        assert "UnquantizedFusedMoEMethod" not in op_registry_oot
        assert ">=0.32,<0.33" in caplog.text and "found vllm 0.31.0" in caplog.text
    finally:
        op_registry_oot.clear()
        op_registry_oot.update(before)
