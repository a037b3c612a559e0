"""A `wisp plan` file inside vLLM (`additional_config={"wisp": {"plan": ...}}`), end to end on the CPU: the expert
slots and vLLM's KV cache come from the plan's one budget, and a plan that does not fit stops vLLM with one error."""

from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # each LLM takes seconds to build

from tests.integrations.vllm import test_vllm_offline  # noqa: E402
from tests.integrations.vllm.plans import tiny_plan  # noqa: E402
from tests.integrations.vllm.registered import wisp_registered  # noqa: E402
from tests.integrations.vllm.test_vllm_offline import greedy, make_llm, tiny_bf16_checkpoint  # noqa: E402
from wisp.integrations.vllm import applied_plan  # noqa: E402
from wisp.integrations.vllm.settings import layer_index_of  # noqa: E402
from wisp.models.config_parsers import read_model_config  # noqa: E402
from wisp.plan.plan_file import write_plan  # noqa: E402

vllm_env = test_vllm_offline.vllm_env  # its environment fixture (one process, the CPU settings), shared


@pytest.fixture(scope="module")
def qwen3_moe(vllm_env, tmp_path_factory):
    """The tiny Qwen3-MoE (layers 0 and 2 MoE), with wisp's method registered for this module."""
    with wisp_registered():
        yield tiny_bf16_checkpoint("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


@pytest.fixture(scope="module")
def plans(qwen3_moe, tmp_path_factory):
    """{name: (Plan, its file)}: "qwen3" (caps 2 and 5; KV the floor of 5 requests of 100 tokens: 35 blocks of
    16 tokens, 4.375 of vLLM's 128-token CPU blocks) and "olmoe" (made for the tiny OLMoE)."""
    folder = tmp_path_factory.mktemp("plans")
    made = {"qwen3": tiny_plan(read_model_config(qwen3_moe), slots=5, max_concurrency=5, caps=(2, 5)),
            "olmoe": tiny_plan(read_model_config(tiny_bf16_checkpoint("olmoe", folder / "olmoe")), slots=4)}
    for name, plan in made.items():
        write_plan(plan, folder / f"{name}.json")
    return {name: (plan, folder / f"{name}.json") for name, plan in made.items()}


def test_a_plan_sizes_the_expert_slots_and_vllms_kv_cache(qwen3_moe, plans, monkeypatch):
    plan, path = plans["qwen3"]
    warned = []  # the plug-in's warnings (vLLM reconfigures logging while it starts, dropping added handlers)
    monkeypatch.setattr(applied_plan.logger, "warning", lambda message, *args: warned.append(message % args))
    llm = make_llm(qwen3_moe, {"wisp": {"plan": str(path)}}, max_model_len=100)
    out, counters = greedy(llm)
    assert {layer_index_of(name): c["slots"] for name, c in counters.items()} == {0: 2, 2: 5}
    kv = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config  # what vLLM allocated, after load
    allocated = sum(t.size for t in kv.kv_cache_tensors)
    block = allocated // kv.num_blocks
    assert plan.report.kv_bytes - block < allocated <= plan.report.kv_bytes  # within one of vLLM's blocks
    assert kv.num_blocks == llm.llm_engine.vllm_config.cache_config.num_gpu_blocks == 560 // 128
    assert len(warned) == 1 and f"{plan.report.kv_bytes} bytes, in place of the {1 << 30} bytes given" in warned[0]
    assert out == greedy(make_llm(qwen3_moe, max_model_len=100))[0]  # vLLM's own method (no "wisp" table)


@pytest.mark.parametrize("table, message", [
    ({"plan": "olmoe"}, r"was made for another model: it records OlmoeForCausalLM, 2 MoE layers, .*; vLLM serves "
                        r"Qwen3MoeForCausalLM, 2 MoE layers"),
    ({"plan": "qwen3", "expert_cap": 4}, '"plan" and "expert_cap" both set the expert caps: give one'),
    ({"plan": "missing"}, "could not read plan .*missing.json"),
])
def test_a_plan_that_does_not_fit_stops_vllm_with_one_clear_error(qwen3_moe, plans, table, message):
    name = table["plan"]
    file = plans[name][1] if name in plans else plans["qwen3"][1].with_name(f"{name}.json")
    with pytest.raises(Exception, match=message):
        make_llm(qwen3_moe, {"wisp": {**table, "plan": str(file)}}, max_model_len=100)
