"""`wisp bench decode` end to end on tiny shapes (CPU), and dummy weights equal to a written checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_runner import run_wisp
from wisp.models.config_parsers import model_config
from wisp.models.loader import CheckpointReader
from wisp.models.demo import DEMO_CONFIG
from wisp.models.random_checkpoint import RandomWeights, write_random_checkpoint

KEYS = {"preset", "mode", "expert_cap", "decode_tok_s", "ttft_s", "hit_rate", "bytes_h2d_per_token",
        "h2d_gbps_achieved", "h2d_gbps_probe", "step_s", "roofline_step_s", "peak_gpu_bytes", "gpu", "command"}


@pytest.mark.slow
def test_bench_decode_writes_one_record_per_run(tmp_path):
    out = tmp_path / "b.json"
    proc = run_wisp(["decode", "--model", "demo", "--load-format", "dummy", "--mode", "paged,resident,offload",
                     "--expert-cap", "4,8", "--prompt-len", "40", "--decode-tokens", "5", "--device", "cpu",
                     "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [(r["mode"], r["expert_cap"]) for r in records] == [("resident", 16), ("paged", 4), ("paged", 8), ("offload", 16)]
    for r in records:
        assert KEYS <= set(r) and r["decode_tokens"] == 5 and r["decode_tok_s"] > 0
        assert r["prefill_tokens"] == 40  # a cold prompt: none of its blocks came from the prefix cache
        # the spread of the 5 timed steps, whose mean is step_s (rounded to 1 us)
        assert r["step_s_median"] <= r["step_s_p90"] <= r["step_s_max"] and r["step_s"] <= r["step_s_max"] + 1e-6
        assert r["step_s_max"] <= 5 * r["step_s"] + 1e-6
    assert records[0]["hit_rate"] == 1.0 and records[0]["bytes_h2d_per_token"] == 0
    assert records[1]["bytes_h2d_per_token"] > 0 and records[3]["bytes_h2d_per_token"] == 4 * 16 * 3 * 128 * 64 * 4
    assert records[1]["roofline_step_s"] == records[0]["step_s"]  # no GPU probe here: the resident step alone


def test_bench_decode_hybrid_and_prefetch_records_say_what_they_did(tmp_path):
    out = tmp_path / "h.json"
    proc = run_wisp(["decode", "--model", "demo", "--load-format", "dummy", "--mode", "resident,paged,hybrid", "--prefetch",
                     "--expert-cap", "4", "--prompt-len", "16", "--decode-tokens", "4", "--device", "cpu", "--out", out],
                    tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = {r["mode"]: r for r in json.loads(out.read_text())}
    assert "prefetch" not in records["resident"] and "prefetch" not in records["hybrid"]  # paged runs only
    assert records["paged"]["prefetch"] and records["paged"]["experts_prefetched"] > 0
    assert set(records["hybrid"]["hybrid_costs"]) >= {"copy_s", "cpu_rows"}
    assert records["hybrid"]["experts_on_cpu"] >= 0


def test_a_budget_sizes_hybrid_without_slots_hot_experts(tmp_path):
    """`--mode hybrid --expert-cap 0 --vram-budget X`: the budget sizes the hot experts (one request's KV floor
    first), the cap stays 0, and the record says how many; with --hot-experts too, one error."""
    from wisp.plan.planner import PlanInputs
    from wisp.plan.sizes import ModelSizes

    sizes, floor = ModelSizes.of(model_config(DEMO_CONFIG), 16), -(-(16 + 4 + 8) // 16)
    budget = sizes.non_expert_bytes + PlanInputs.reserve_bytes + floor * sizes.block_bytes + 5 * sizes.slot_bytes
    out = tmp_path / "hot.json"
    flags = ["decode", "--model", "demo", "--load-format", "dummy", "--mode", "hybrid", "--expert-cap", "0",
             "--prompt-len", "16", "--decode-tokens", "4", "--device", "cpu", "--vram-budget", str(budget)]
    proc = run_wisp([*flags, "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    (record,) = json.loads(out.read_text())
    assert (record["mode"], record["expert_cap"], record["hot_experts"]) == ("hybrid", 0, 5)
    proc = run_wisp([*flags, "--hot-experts", "2"], tmp_path / "cache", command="bench")
    assert proc.returncode == 2 and "give one" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_preset_needs_dummy_weights(tmp_path):
    proc = run_wisp(["decode", "--model", "qwen3-30b-a3b"], tmp_path, command="bench")
    assert proc.returncode == 2 and "--load-format dummy" in proc.stderr and "Traceback" not in proc.stderr


def test_dummy_weights_equal_the_written_random_checkpoint(tmp_path):
    write_random_checkpoint(DEMO_CONFIG, tmp_path, seed=5)
    disk, dummy = CheckpointReader(Path(tmp_path)), RandomWeights(model_config(DEMO_CONFIG), seed=5)
    assert set(disk.where) == set(dummy.specs)
    assert all(torch.equal(disk.get(k), dummy.get(k)) for k in dummy.specs)
    disk.close()


def _demo_trace(path: Path, layers: int = 4, k: int = 4, sequences: int = 1) -> Path:
    """Sequence s: every token, every layer, experts s*k .. s*k+k-1."""
    from wisp.trace.format import RoutingTrace

    RoutingTrace.concat([RoutingTrace(np.tile(np.arange(s * k, s * k + k, dtype=np.int16), (6, layers, 1)),
                                      layers=list(range(layers)), num_experts=16) for s in range(sequences)]).save(path)
    return path


@pytest.mark.slow
def test_bench_replays_a_routing_trace_and_runs_zero_copy(tmp_path):
    out = tmp_path / "b.json"
    trace = _demo_trace(tmp_path / "t.npz")
    proc = run_wisp(["decode", "--model", "demo", "--load-format", "dummy", "--mode", "paged,zero-copy", "--expert-cap", "4",
                     "--prompt-len", "6", "--decode-tokens", "5", "--device", "cpu", "--routing-trace", trace,
                     "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    paged, zero = json.loads(out.read_text())
    assert paged["routing"] == zero["routing"] == "replay-per-request:t.npz" and paged["routing_sequences"] == 1
    # the replayed experts are the same every step: after the first decode step every lookup hits
    assert paged["hit_rate"] >= 0.8 and paged["bytes_h2d_per_token"] <= round(4 * 4 * 98304 / 5)  # (rounded in the record)
    # zero-copy reads each routed pair's expert in place: 4 layers x 4 pairs x 98304 bytes, no device bytes
    assert zero["bytes_h2d_per_token"] == 4 * 4 * 98304 and zero["expert_device_bytes"] == 0


@pytest.mark.slow
def test_bench_replays_each_request_of_a_batch_its_own_sequence(tmp_path):
    out = tmp_path / "b.json"
    trace = _demo_trace(tmp_path / "t.npz", sequences=4)  # 4 requests x 4 experts: every step all 16 of a layer
    proc = run_wisp(["decode", "--model", "demo", "--load-format", "dummy", "--mode", "paged", "--expert-cap", "8",
                     "--prompt-len", "6", "--decode-tokens", "5", "--batch", "4", "--device", "cpu",
                     "--routing-trace", trace, "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    (record,) = json.loads(out.read_text())
    assert record["routing"] == "replay-per-request:t.npz" and record["routing_sequences"] == 4
    assert record["hit_rate"] <= 0.5  # 16 experts a layer each step through 8 slots (one shared row: all hits)


@pytest.mark.slow
def test_bench_refuses_a_trace_of_another_shape(tmp_path):
    trace = _demo_trace(tmp_path / "t.npz", layers=3)
    proc = run_wisp(["decode", "--model", "demo", "--load-format", "dummy", "--device", "cpu", "--decode-tokens", "2",
                     "--prompt-len", "4", "--routing-trace", trace], tmp_path / "cache", command="bench")
    assert proc.returncode == 2 and "3 layers" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_bench_prefill_writes_a_record_per_run_and_length(tmp_path):
    out, plot = tmp_path / "p.json", tmp_path / "p.png"
    proc = run_wisp(["prefill", "--model", "demo", "--load-format", "dummy", "--mode", "paged,resident", "--expert-cap", "4",
                     "--prompt-len", "100,20", "--max-num-batched-tokens", "48", "--device", "cpu", "--out", out,
                     "--plot", plot], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [(r["mode"], r["prompt_len"]) for r in records] == [("resident", 20), ("resident", 100), ("paged", 20), ("paged", 100)]
    for r in records:
        assert r["prefill_tokens"] == r["prompt_len"] and r["ttft_s"] > 0  # cold: no prefix-cache hit
        assert r["prefill_steps"] == -(-r["prompt_len"] // 48)  # chunked by the token budget
    resident, paged = records[:2], records[2:]
    assert all(r["bytes_h2d"] == 0 and r["distinct_missing"] == 0 for r in resident)
    for r in paged:  # every load is a routed expert that was missing; one chunk loads each at most once
        assert r["distinct_missing"] > 0 and r["bytes_h2d"] == r["expert_loads_per_layer"] * 4 * r["expert_bytes"]
        assert r["expert_loads_per_layer"] * 4 >= r["distinct_missing"]
    assert paged[0]["expert_loads_per_layer"] * 4 == paged[0]["distinct_missing"]  # 20 tokens: one chunk
    assert plot.stat().st_size > 0
