"""Tensor parallel (TP = 2) on the CPU, each rank paging its own shard of every expert (skipped where vllm is not
installed). Both runs are processes of their own (`offline_run`), started together: vLLM without plug-ins
(`VLLM_PLUGINS=""`) and vLLM loading wisp through its entry point in every worker, at C = top_k. The paged run
must give the baseline's greedy tokens and top-5 logprobs exactly, and both ranks must report the same counters,
each load moving half an expert.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow  # two TP = 2 engines, about 80 s on 2 cores

from tests.integrations.vllm.checkpoints import tiny_bf16_checkpoint  # noqa: E402
from tests.integrations.vllm.processes import offline  # noqa: E402

N, TOP_K, INTERMEDIATE = 8, 2, 64  # 64 so that each rank's half (32) needs no padding by vLLM's CPU kernel
EXPERT_BYTES = (2 * INTERMEDIATE * 64 + 64 * INTERMEDIATE) * 2  # one whole expert, gate_up and down, bf16
PROMPTS = [[1, 5, 9, 22, 7, 3], [4, 8, 15, 16, 23, 42, 99, 17, 60], [120, 2, 77, 31]]
# each worker pinned to a core of its own; apply_model ships its function to the worker processes
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def tp2(tmp_path: Path, name: str, checkpoint: Path, additional_config: dict, **env: str):
    engine = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp", "additional_config": additional_config}
    return offline(tmp_path, name, checkpoint, engine, PROMPTS, **TP2_ENV, **env)


def test_tp2_ranks_page_their_shards_with_vllms_tokens_and_logprobs(tmp_path):
    checkpoint = tiny_bf16_checkpoint("qwen3_moe", tmp_path / "qwen3_moe", moe_intermediate_size=INTERMEDIATE)
    runs = [tp2(tmp_path, "vllm", checkpoint, {}, VLLM_PLUGINS=""),
            tp2(tmp_path, "wisp", checkpoint, {"wisp": {"mode": "paged", "expert_cap": TOP_K}})]
    try:
        baseline, paged = (run.result() for run in runs)
    finally:
        for run in runs:
            run.stop()
    assert paged["outputs"] == baseline["outputs"]
    assert baseline["counters"] == [{}, {}]
    rank0, rank1 = paged["counters"]
    assert rank0 == rank1  # the router's choice is replicated: both ranks page the same experts, each its shard
    assert sorted(rank0) == ["model.layers.0.mlp.experts.routed_experts", "model.layers.2.mlp.experts.routed_experts"]
    for c in rank0.values():
        assert c["misses"] > N and c["evictions"] > 0 and c["wide_steps"] > 0
        assert c["bytes_h2d"] == c["loads"] * EXPERT_BYTES // 2
