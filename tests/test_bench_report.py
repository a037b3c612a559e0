"""BENCHMARKS.md is a pure function of the result files, and the checked-in page is up to date."""

from __future__ import annotations

import json
from pathlib import Path

from wisp.bench.report import load_records, render

ROOT = Path(__file__).resolve().parents[1]


def test_every_record_is_a_row_and_missing_fields_show_as_dashes(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([
        {"mode": "paged", "expert_cap": 16, "decode_tok_s": 6.7, "step_s": 0.149, "roofline_step_s": 0.0967,
         "bytes_h2d_per_token": 338e6, "peak_gpu_bytes": 10.4e9, "preset": "qwen3-30b-a3b", "gpu": "H200"},
        {"mode": "resident", "expert_cap": 128},
    ]))
    (tmp_path / "b.json").write_text(json.dumps({"mode": "offload", "expert_cap": 8}))
    page = render(load_records(tmp_path))
    rows = [line for line in page.splitlines() if line.startswith("| ") and "mode" not in line]
    assert len(rows) == 3
    assert "| paged | 16 | 1 | torch / torch | - | - | 6.70 | 149.0 | 96.7 |" in rows[0] and "| 338.0 |" in rows[0]
    assert rows[1].count("| - ") >= 5


def test_auto_backends_graphs_and_replay_are_named(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([
        {"mode": "paged", "expert_cap": 6, "moe_backend": "auto", "attention_backend": "auto", "gpu": "NVIDIA H200",
         "graph_steps": 63, "routing": "replay:t.npz"},
        {"mode": "paged", "expert_cap": 6, "moe_backend": "auto", "attention_backend": "torch", "gpu": "cpu", "graph_steps": 0},
    ]))
    rows = [line for line in render(load_records(tmp_path)).splitlines() if line.startswith("| paged")]
    assert rows[0].startswith("| paged | 6 | 1 | triton / triton | yes | replay:t.npz |")
    assert rows[1].startswith("| paged | 6 | 1 | torch / torch | no | - |")


def test_checked_in_benchmarks_page_matches_the_results():
    assert (ROOT / "BENCHMARKS.md").read_text() == render(load_records(ROOT / "benchmarks" / "results"))


def test_prefill_records_get_their_own_columns(tmp_path):
    from wisp.bench.report import load_records, render

    record = {"mode": "paged", "expert_cap": 16, "prompt_len": 2048, "prefill_tokens": 2048, "prefill_steps": 1, "ttft_s": 1.653, "bound_s": 1.332,
              "ttft_over_bound": 1.241, "expert_loads_per_layer": 54.6, "distinct_missing": 2621, "bytes_h2d": 24.73e9,
              "h2d_gbps_probe": 55.2, "gpu": "H200", "preset": "qwen3-30b-a3b", "max_num_batched_tokens": 2048}
    (tmp_path / "prefill_x.json").write_text(json.dumps([record]))
    page = render(load_records(tmp_path))
    assert "| mode | cap | prompt | steps | TTFT s | bound s | TTFT / bound |" in page
    assert "| paged | 16 | 2048 | 1 | 1.653 | 1.332 | 1.24 | 54.6 | 2621 | 24.73 | 55.2 |" in page
    assert "cold prompts, 2048 tokens per step" in page


def test_llama_cpp_comparison_rows_pair_each_placement_and_render_as_a_peer_table(tmp_path):
    from wisp.bench.llama_cpp import compare
    peer = [{"placement": "all-cpu", "placement_flags": "-ngl 99 -ncmoe 16", "weights": "BF16", "decode_tok_s": 40.0,
             "ttft_s": {"512": 0.8, "2048": 2.0}, "peak_gpu_bytes": 2.0e9, "gpu": "H200", "command": "llama-bench", "preset": "p"}]
    tagged = {"placement": "all-cpu", "vram_budget_nvidia_smi": 2.0e9, "gpu": "H200", "preset": "p", "command": "wisp bench"}
    decode = [{**tagged, "mode": "zero-copy", "expert_cap": 64, "decode_tok_s": 30.0, "peak_gpu_bytes_nvidia_smi": 1.9e9},
              {**tagged, "mode": "paged", "expert_cap": 8, "decode_tok_s": 80.0, "peak_gpu_bytes_nvidia_smi": 3.0e9},
              {**tagged, "mode": "hybrid", "expert_cap": 0, "hot_experts": 2, "decode_tok_s": 44.0,
               "peak_gpu_bytes_nvidia_smi": 1.99e9}]
    prefill = [{**tagged, "mode": "zero-copy", "expert_cap": 64, "prompt_len": n, "max_num_batched_tokens": chunk, "ttft_s": t,
                "peak_gpu_bytes_nvidia_smi": peak} for n, chunk, t, peak in
               [(512, 2048, 0.3, 2.4e9), (2048, 2048, 0.5, 2.4e9), (2048, 512, 1.0, 1.95e9)]]
    prefill += [{**tagged, "mode": "hybrid", "expert_cap": 0, "hot_experts": hot, "prompt_len": 2048,
                 "max_num_batched_tokens": 512, "ttft_s": t, "peak_gpu_bytes_nvidia_smi": 2.1e9} for hot, t in [(0, 1.6), (2, 1.5)]]
    rows = compare.compare(peer, decode, prefill)
    theirs, zero, paged, hot, chunked, no_hot = rows
    # our runs pair by mode, cap and hot experts: the hot run's prefill is its own, the other hybrid's a row apart
    assert (hot["mode"], hot["ttft_2048_s"], hot["within_budget"]) == ("hybrid (2 hot experts a layer)", 1.5, False)
    assert (no_hot["mode"], no_hot["decode_tok_s"], no_hot["ttft_2048_s"]) == ("hybrid", None, 1.6)
    assert theirs["system"] == "llama.cpp" and theirs["ttft_2048_s"] == 2.0
    # a decode run takes its mode's widest prefill chunk; narrower chunks get their own row
    assert (zero["decode_tok_s"], zero["ttft_2048_s"], zero["prefill_chunk_tokens"]) == (30.0, 0.5, 2048)
    assert zero["within_budget"] is False  # the prefill's 2.4 GB is over llama.cpp's 2.0, though decode's 1.9 is not
    assert (zero["decode_vs_llama_cpp"], zero["ttft_2048_vs_llama_cpp"]) == (0.75, 4.0)
    assert paged["ttft_2048_s"] is None and paged["within_budget"] is False and paged["decode_vs_llama_cpp"] == 2.0
    assert (chunked["decode_tok_s"], chunked["ttft_2048_s"], chunked["within_budget"]) == (None, 1.0, True)
    (tmp_path / "peer.json").write_text(json.dumps(rows))
    page = render(load_records(tmp_path))
    assert "| system | placement | mode / flags | cap |" in page
    assert "| wisp | all-cpu | zero-copy | 64 | decode: router; TTFT: random-router | 30.00 | 0.300 | 0.500 | 2048 | 1.90 | 2.40 | no | 0.75x | 4.00x |" in page


def test_serve_records_get_their_own_table(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps([
        {"loop": "closed", "prompt_len": 128, "output_len": 64, "routing": "random-router", "model": "m", "concurrency": 4,
         "load_control": "on", "expert_cap": 16, "max_concurrency": 4, "decode_tok_s": 66.17, "itl_p99_s": 1.785},
    ]))
    page = render(load_records(tmp_path))
    assert "closed loop, prompt 128 tokens, 64 output tokens" in page and "| aggregate tok/s |" in page
    assert "| on | 16 | 4 | 4 | 66.2 |" in page and "| 1785.0 |" in page


def test_grammar_mask_records_get_their_own_columns(tmp_path):
    record = {"grammar_engine": "llguidance 1.9.1", "grammar": "tool call", "batch": 8, "allowed_share": 0.16,
              "mask_us_mean": 328.4, "mask_us_p99": 2588.0, "apply_us_mean": 41.2, "advance_us_mean": 55.0,
              "total_us_mean": 424.6, "total_us_p99": 2700.0, "compile_cold_ms": 1.3, "vocab_size": 151936,
              "tokens": 256, "gpu": "NVIDIA H200"}
    (tmp_path / "grammar_mask_cost.json").write_text(json.dumps([record]))
    page = render(load_records(tmp_path))
    assert "| engine | grammar | batch | allowed | mask us mean |" in page
    assert "| llguidance 1.9.1 | tool call | 8 | 0.16 | 328 | 2588 | 41 | 55 | 425 | 2700 | 1.3 |" in page
    assert "151,936-token vocabulary" in page
