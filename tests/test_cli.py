"""End-to-end tests of `wisp generate`, run as a subprocess (`python -m wisp`), as a user would.

Each subprocess imports torch (~2-3 s), so the module runs every command line it needs once, a few
at a time (`runs`), and the tests compare those results.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli_runner import run_many, run_wisp

pytestmark = pytest.mark.slow  # every test here reads `wisp` subprocess runs

DEMO_EOS = 256
# demo: hidden 128, moe_intermediate 64, float32 -> gate + up + down of one expert
DEMO_EXPERT_BYTES = 3 * 128 * 64 * 4
# the demo samples by default (its generation_config.json): --temperature 0 asks for greedy
GREEDY = ("--model", "demo", "--prompt", "Hello", "--max-tokens", "8", "--json", "--temperature", "0")
SAMPLED = (*GREEDY, "--temperature", "1.5", "--seed", "7")  # far from greedy: a trained model is confident
HF_FAMILY = "qwen2_moe"  # the most quirks: shared expert, dense layers between MoE layers


@pytest.fixture(scope="module")
def runs(tmp_path_factory, hf_checkpoints) -> dict[str, subprocess.CompletedProcess]:
    # the same folder as conftest's autouse WISP_CACHE fixture, so the demo is written once per session
    cache = tmp_path_factory.getbasetemp() / "wisp-cache"
    first = run_wisp(GREEDY, cache)
    rest = run_many(
        {
            "resident": (*GREEDY, "--mode", "resident"),
            "offload": (*GREEDY, "--mode", "offload"),
            "paged_cap4": (*GREEDY, "--mode", "paged", "--expert-cap", "4"),
            "zero-copy": (*GREEDY, "--mode", "zero-copy", "--enforce-eager"),  # auto: the torch path on CPU, Triton on CUDA
            "sampled": SAMPLED,
            "sampled_again": SAMPLED,  # a second, independent process
            "plain": ("--model", "demo", "--prompt", "Hello", "--max-tokens", "8", "--temperature", "0"),
            "old_spelling": (*GREEDY, "--mode", "hybrid", "--expert-cap", "0"),  # hybrid-zero-copy's old name
            "hf_prompt_ids": ("--model", hf_checkpoints[HF_FAMILY], "--prompt-ids", "1,2,3,4", "--max-tokens", "5",
                              "--expert-cap", "2", "--json"),
        },
        cache,
    )
    return {"greedy": first, **rest}


def ok_json(proc: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {proc.stdout!r}"
    return json.loads(lines[0])


def check_tokens(token_ids, max_tokens: int, eos: int | None) -> None:
    assert isinstance(token_ids, list) and all(type(t) is int for t in token_ids), token_ids
    assert 1 <= len(token_ids) <= max_tokens
    if len(token_ids) < max_tokens:
        assert eos is not None and token_ids[-1] == eos, f"stopped early without EOS: {token_ids}"


def test_json_output_shape(runs):
    out = ok_json(runs["greedy"])
    check_tokens(out["token_ids"], 8, DEMO_EOS)
    assert isinstance(out["text"], str)
    assert out["finish_reason"] in ("stop", "length")
    stats = out["stats"]
    for key in ("expert_hits", "expert_misses", "bytes_h2d"):
        assert type(stats[key]) is int and stats[key] >= 0, (key, stats[key])
    assert stats["mode"] == "paged"
    assert stats["expert_hits"] + stats["expert_misses"] > 0


@pytest.mark.parametrize("run", ["resident", "offload", "paged_cap4", "zero-copy"])
def test_modes_give_identical_tokens(runs, run):
    base = ok_json(runs["greedy"])
    other = ok_json(runs[run])
    assert other["token_ids"] == base["token_ids"]
    assert other["text"] == base["text"]
    assert other["stats"]["mode"] == run.split("_")[0]


def test_zero_copy_holds_no_expert_on_the_device(runs):
    stats = ok_json(runs["zero-copy"])["stats"]
    assert stats["expert_device_bytes"] == 0 and stats["expert_hits"] == 0 and stats["bytes_h2d"] > 0
    # decode reads in place; a prompt layer whose experts are each routed twice or more on average copies them
    # once each through the staging buffers (the demo's 5-token prompt does, in every layer)
    assert 0 < stats["expert_loads"] < stats["expert_misses"]


def test_resident_mode_moves_no_expert_bytes(runs):
    stats = ok_json(runs["resident"])["stats"]
    assert stats["expert_misses"] == 0
    assert stats["bytes_h2d"] == 0


def test_paged_small_cap_counts_traffic(runs):
    stats = ok_json(runs["paged_cap4"])["stats"]
    assert stats["expert_cap"] == 4
    assert stats["expert_misses"] > 0
    assert stats["expert_loads"] == stats["expert_misses"]  # paged: each miss copies one expert in
    assert stats["bytes_h2d"] == stats["expert_loads"] * DEMO_EXPERT_BYTES


def test_sampling_is_seeded(runs):
    first = ok_json(runs["sampled"])
    check_tokens(first["token_ids"], 8, DEMO_EOS)
    assert ok_json(runs["sampled_again"])["token_ids"] == first["token_ids"]
    assert first["token_ids"] != ok_json(runs["greedy"])["token_ids"], "temperature 1.5 gave exactly the greedy tokens"


def test_an_old_mode_spelling_runs_and_says_its_new_name_in_one_wisp_line(runs):
    ok_json(runs["old_spelling"])
    warned = [line for line in runs["old_spelling"].stderr.splitlines() if "deprecated" in line]
    assert warned == ["wisp: --mode hybrid --expert-cap 0 is deprecated: it is --mode hybrid-zero-copy"]


def test_plain_output(runs):
    proc = runs["plain"]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    # the text alone on stdout (print adds the newline); the stats line goes to stderr
    assert proc.stdout == ok_json(runs["greedy"])["text"] + "\n"
    assert "hits=" in proc.stderr and "misses=" in proc.stderr


def test_prompt_ids_on_hf_checkpoint(runs):
    out = ok_json(runs["hf_prompt_ids"])
    assert len(out["token_ids"]) == 5  # fixtures have no EOS: always the full length
    check_tokens(out["token_ids"], 5, None)
    assert all(0 <= t < 128 for t in out["token_ids"])
    assert out["text"] == ""  # no tokenizer.json, so no text
    assert out["stats"]["expert_cap"] == 2
    assert out["stats"]["expert_misses"] > 0
