"""`wisp bench sweep`: hybrid's CPU expert kernels end to end on tiny shapes (a record per bank kind, experts a
call and thread count; no GPU side without CUDA), and the GPU-only sweeps as one line on a machine without
CUDA (on one with it, their default launches run)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.cli_runner import run_wisp

CUDA = torch.cuda.is_available()


def test_cpu_experts_gives_a_rate_per_bank_call_size_and_kernel(tmp_path):
    out = tmp_path / "cpu.json"
    proc = run_wisp(["sweep", "cpu-experts", "--hidden", "256", "--intermediate", "128", "--experts", "8", "--top-k", "2",
                     "--repeats", "2", "--threads", "1", "--per-call", "1,2", "--kernels", "plain,reference",
                     "--bank", "pinned,huge", "--out", out], tmp_path, timeout=300, command="bench")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["cpu_kernels"] == ["plain", "reference"] and set(record["banks"]) == {"pinned", "huge"}
    for bank in record["banks"].values():
        assert bank["bank_bytes"] == 8 * (2 * 128 * 256 + 256 * 128) * 2  # bf16 gate_up and down of every expert
        for key in ("1_per_call/1_threads", "2_per_call/1_threads"):
            rates = bank[key]["alone"]
            assert set(rates) == {"plain", "reference"} and all(v > 0 for v in rates.values())  # GB/s, 0.1 apart
            assert CUDA or set(bank[key]) == {"alone"}  # the GPU's reads beside it need CUDA


def test_cpu_experts_times_quantized_banks_by_their_packed_bytes(tmp_path):
    out = tmp_path / "formats.json"
    proc = run_wisp(["sweep", "cpu-experts", "--hidden", "256", "--intermediate", "128", "--experts", "8", "--repeats", "2",
                     "--threads", "1", "--kernels", "native,plain", "--weights", "fp8,mxfp4,q8_0", "--out", out],
                    tmp_path, timeout=300, command="bench")
    assert proc.returncode == 0, proc.stderr
    banks = json.loads(out.read_text())["banks"]
    assert set(banks) == {"fp8", "mxfp4", "q8_0"}  # no bf16 bank unless asked
    weights = 8 * (2 * 128 * 256 + 256 * 128)
    assert banks["fp8"]["bank_bytes"] == weights + 8 * (2 * 2 + 2 * 1) * 4  # a byte each, float32 128x128 scales
    assert banks["mxfp4"]["bank_bytes"] == weights // 2 + weights // 32  # a nibble each, a byte per 32
    assert banks["q8_0"]["bank_bytes"] == weights + weights // 32 * 2  # a byte each, float16 per 32
    for bank in banks.values():
        assert set(bank["1_per_call/1_threads"]) == {"alone"}  # the GPU's readers take bf16 banks only
        rates = bank["1_per_call/1_threads"]["alone"]  # GB/s, 0.1 apart: torch's dequantizing kernel may show 0.0
        assert set(rates) == {"native", "plain"} and rates["native"] > 0
    proc = run_wisp(["sweep", "cpu-experts", "--weights", "fp4"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "--weights fp4" in proc.stderr and "Traceback" not in proc.stderr


def test_an_unknown_cpu_kernel_is_one_line(tmp_path):
    proc = run_wisp(["sweep", "cpu-experts", "--kernels", "plain,fastest"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "unknown CPU kernel 'fastest'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the sweeps run (below)")
@pytest.mark.parametrize("sweep", ["moe-attention", "linear"])
def test_gpu_sweeps_without_cuda_are_one_line(tmp_path, sweep):
    proc = run_wisp(["sweep", sweep, "--no-sweep"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "needs a CUDA device" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not CUDA, reason="times GPU kernels")
def test_gpu_sweeps_time_their_default_launches(tmp_path):
    moe, linear = tmp_path / "moe.json", tmp_path / "linear.json"
    proc = run_wisp(["sweep", "moe-attention", "--no-sweep", "--out", moe], tmp_path, timeout=600, command="bench")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(moe.read_text())
    assert record["unit"] == "us" and "moe olmoe T=1 host" in record["results"]
    assert all(record["bits_equal_to_default"].values())
    proc = run_wisp(["sweep", "linear", "--models", "olmoe-1b-7b", "--rows", "1,16", "--no-sweep", "--out", linear],
                    tmp_path, timeout=600, command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(linear.read_text())["records"]
    assert {(r["weight"], r["rows"]) for r in records} == {(w, t) for w in ("q", "kv", "o", "router", "lm_head")
                                                           for t in (1, 16)}
