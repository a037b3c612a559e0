"""`wisp bench llama-cpp compare` end to end: the peer's and our record files become one comparison file (its
rows' pairing is tests/test_bench_report.py's), and a record file that cannot be read is one line."""

from __future__ import annotations

import json

from tests.cli_runner import run_wisp

PEER = {"placement": "all-cpu", "placement_flags": "-ngl 99 -ncmoe 16", "weights": "BF16", "decode_tok_s": 40.0,
        "ttft_s": {"512": 0.8, "2048": 2.0}, "peak_gpu_bytes": 2.0e9, "gpu": "H200", "command": "llama-bench",
        "preset": "p"}
OURS = {"placement": "all-cpu", "vram_budget_nvidia_smi": 2.0e9, "gpu": "H200", "preset": "p", "command": "wisp bench",
        "mode": "hybrid", "expert_cap": 0, "peak_gpu_bytes_nvidia_smi": 1.9e9}


def test_records_become_one_comparison_file(tmp_path):
    (tmp_path / "peer.json").write_text(json.dumps([PEER]))
    (tmp_path / "decode.json").write_text(json.dumps([{**OURS, "decode_tok_s": 60.0}]))
    (tmp_path / "prefill.json").write_text(json.dumps({**OURS, "prompt_len": 2048, "ttft_s": 1.0,
                                                       "max_num_batched_tokens": 512}))
    out = tmp_path / "cmp.json"
    proc = run_wisp(["llama-cpp", "compare", "--peer", tmp_path / "peer.json", "--decode", tmp_path / "decode.json",
                     "--prefill", tmp_path / "prefill.json", "--note", "n", "--out", out], tmp_path, timeout=60,
                    command="bench")
    assert proc.returncode == 0, proc.stderr
    theirs, ours = json.loads(out.read_text())
    assert (theirs["system"], theirs["note"], ours["system"]) == ("llama.cpp", "n", "wisp")
    assert (ours["decode_vs_llama_cpp"], ours["ttft_2048_vs_llama_cpp"], ours["within_budget"]) == (1.5, 2.0, True)
    assert len(proc.stdout.strip().splitlines()) == 2


def test_a_missing_record_file_is_one_line(tmp_path):
    proc = run_wisp(["llama-cpp", "compare", "--peer", tmp_path / "none.json", "--decode", tmp_path / "none.json",
                     "--out", tmp_path / "cmp.json"], tmp_path, timeout=60, command="bench")
    assert proc.returncode == 2 and "cannot read the records" in proc.stderr and "Traceback" not in proc.stderr
