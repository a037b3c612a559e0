"""`wisp bench decode` end to end on tiny shapes (CPU), and dummy weights equal to a written checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.cli_runner import run_wisp
from wisp.config import ModelConfig
from wisp.models.loader import CheckpointReader
from wisp.models.random_checkpoint import DEMO_CONFIG, RandomWeights, write_random_checkpoint

KEYS = {"preset", "mode", "expert_cap", "decode_tok_s", "ttft_s", "hit_rate", "bytes_h2d_per_token",
        "h2d_gbps_achieved", "h2d_gbps_probe", "step_s", "roofline_step_s", "peak_gpu_bytes", "gpu", "command"}


def test_bench_decode_writes_one_record_per_run(tmp_path):
    out = tmp_path / "b.json"
    proc = run_wisp(["decode", "--model", "demo", "--load-format", "dummy", "--mode", "paged,resident,offload",
                     "--expert-cap", "4,8", "--prompt-len", "6", "--decode-tokens", "5", "--device", "cpu",
                     "--out", out], tmp_path / "cache", command="bench")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(out.read_text())
    assert [(r["mode"], r["expert_cap"]) for r in records] == [("resident", 16), ("paged", 4), ("paged", 8), ("offload", 16)]
    for r in records:
        assert KEYS <= set(r) and r["decode_tokens"] == 5 and r["decode_tok_s"] > 0
    assert records[0]["hit_rate"] == 1.0 and records[0]["bytes_h2d_per_token"] == 0
    assert records[1]["bytes_h2d_per_token"] > 0 and records[3]["bytes_h2d_per_token"] == 4 * 16 * 3 * 128 * 64 * 4
    assert records[1]["roofline_step_s"] == records[0]["step_s"]  # no GPU probe here: the resident step alone


def test_a_preset_needs_dummy_weights(tmp_path):
    proc = run_wisp(["decode", "--model", "qwen3-30b-a3b"], tmp_path, command="bench")
    assert proc.returncode == 2 and "--load-format dummy" in proc.stderr and "Traceback" not in proc.stderr


def test_dummy_weights_equal_the_written_random_checkpoint(tmp_path):
    write_random_checkpoint(DEMO_CONFIG, tmp_path, seed=5)
    disk, dummy = CheckpointReader(Path(tmp_path)), RandomWeights(ModelConfig.from_hf(DEMO_CONFIG), seed=5)
    assert set(disk.where) == set(dummy.specs)
    assert all(torch.equal(disk.get(k), dummy.get(k)) for k in dummy.specs)
    disk.close()
