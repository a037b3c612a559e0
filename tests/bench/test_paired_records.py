"""`wisp bench llama-cpp pair`: a paired run's folder (wisp, llama.cpp, wisp again) becomes one llama.cpp row
and one row per wisp run, with the ratios worked out against that llama.cpp run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_runner import run_wisp


def write(path: Path, data) -> None:
    path.write_text(json.dumps(data))


def paired_folder(out: Path, decode_tok_s: dict[str, float], prefill_peak: dict[str, int]) -> None:
    write(out / "llama_cpp_olmoe-1b-7b_bf16.json", [{
        "placement": "all-cpu", "placement_flags": "-ngl 99 -ncmoe 16", "preset": "olmoe-1b-7b", "gpu": "H200",
        "weights": "olmoe BF16", "llama_cpp_commit": "abc", "command": "llama-bench ...", "decode_tok_s": 40.0,
        "decode_tok_s_unsampled": 50.0, "command_unsampled": "llama-bench -p 0 ...",
        "ttft_s": {"512": 0.5, "2048": 2.0}, "peak_gpu_bytes": 1000}])
    for run, tok_s in decode_tok_s.items():
        totals = {"steps": 32, "kernel_s": 0.032, "routing_wait_s": 0.0032, "gpu_wait_s": 0.0, "gpu_s": 0.016,
                  "cpu_ranks": 160.0, "wall_s": 0.032, "predicted_s": 0.03}
        write(out / f"decode_hybrid_c0_{run}.json", [{
            "expert_cap": 0, "decode_tok_s": tok_s, "step_s": 1 / tok_s, "step_s_median": 0.02, "step_s_p90": 0.021,
            "step_s_max": 0.034, "hybrid_step_kinds": {"1": {"eager": 0.016, "graph": 0.034}}, "hybrid_cpu_steps": totals,
            "piece_steps": 124, "graph_steps": 4, "h2d_gbps_probe": 55.0, "command": "wisp bench decode ...",
            "commit": "stale", "hybrid_cpu_factor": 0.9, "hybrid_link_factor": 1.1}])
        write(out / f"prefill_hybrid_c0_{run}.json", [{"prompt_len": 512, "ttft_s": 0.25, "max_num_batched_tokens": 512},
                                                      {"prompt_len": 2048, "ttft_s": 1.0, "max_num_batched_tokens": 512}])
        write(out / f"smi_decode_hybrid_c0_{run}.json", {"peak_gpu_bytes": 900, "sampler": "NVML"})
        write(out / f"smi_prefill_hybrid_c0_{run}.json", {"peak_gpu_bytes": prefill_peak[run]})


def test_a_paired_folder_becomes_a_llama_cpp_row_and_a_row_per_wisp_run(tmp_path):
    paired_folder(tmp_path, {"before": 60.0, "after": 44.0}, {"before": 990, "after": 1010})
    results = tmp_path / "paired.json"
    write(results, [{"host": "A"}])
    proc = run_wisp(["llama-cpp", "pair", "--out-dir", tmp_path, "--host", "Z", "--commit", "c0ffee", "--append", results],
                    tmp_path / "cache", timeout=60, command="bench")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(results.read_text())
    assert [r["host"] for r in rows] == ["A", "Z", "Z", "Z"]  # kept, then added
    peer, before, after = rows[1:]
    assert peer["system"] == "llama.cpp" and peer["decode_tok_s"] == 40.0 and peer["decode_tok_s_unsampled"] == 50.0
    assert (before["run"], after["run"]) == ("before llama.cpp", "after llama.cpp")
    assert before["decode_vs_llama_cpp"] == 1.5 and after["decode_vs_llama_cpp"] == 1.1
    assert before["decode_vs_llama_cpp_unsampled"] == 1.2 and before["split_step_vs_llama_cpp"] == 1.562  # 1 / 0.016 / 40
    assert before["ttft_2048_vs_llama_cpp"] == 2.0 and before["commit"] == "c0ffee"
    assert before["within_budget"] is True and after["within_budget"] is False  # its prefill peak passed llama.cpp's
    assert before["cpu_experts_per_layer"] == 5.0 and before["per_cpu_layer_ms"]["kernel"] == 1.0
    assert before["memory_sampler"] == "NVML" and "1.5x" in proc.stdout


def test_a_folder_without_llama_cpp_s_record_is_one_clear_error(tmp_path):
    proc = run_wisp(["llama-cpp", "pair", "--out-dir", tmp_path], tmp_path / "cache", timeout=60, command="bench")
    assert proc.returncode == 2 and "llama_cpp_*.json" in proc.stderr and "Traceback" not in proc.stderr
