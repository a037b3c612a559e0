"""End-to-end tests of `wisp generate`, run as a subprocess (`python -m wisp`), as a user would.

Each subprocess imports torch (~2-3 s), so runs are shared: `cli` caches one result per distinct
command line for the whole module, and the tests compare those results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAMILIES

DEMO_EOS = 256
# demo: hidden 128, moe_intermediate 64, float32 -> gate + up + down of one expert
DEMO_EXPERT_BYTES = 3 * 128 * 64 * 4
GREEDY = ("--model", "demo", "--prompt", "Hello", "--max-tokens", "8", "--json")
SAMPLED = (*GREEDY, "--temperature", "0.8", "--seed", "7")


def wisp_env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["WISP_CACHE"] = str(cache)
    env["HF_HUB_OFFLINE"] = "1"  # never reach for the network
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_wisp(args, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wisp", "generate", *map(str, args)],
        env=wisp_env(cache),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def wisp_cache(tmp_path_factory) -> Path:
    # the same folder as conftest's autouse WISP_CACHE fixture, so the demo is written once per session
    return tmp_path_factory.getbasetemp() / "wisp-cache"


@pytest.fixture(scope="module")
def cli(wisp_cache):
    """cli(*args) -> CompletedProcess of `wisp generate *args`; each command line runs once per module."""
    cache = wisp_cache
    done: dict[tuple[str, ...], subprocess.CompletedProcess] = {}

    def call(*args) -> subprocess.CompletedProcess:
        key = tuple(map(str, args))
        if key not in done:
            done[key] = run_wisp(key, cache)
        return done[key]

    return call


def ok_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got: {proc.stdout!r}"
    return json.loads(lines[0])


def check_tokens(token_ids, max_tokens: int, eos: int | None) -> None:
    assert isinstance(token_ids, list) and all(type(t) is int for t in token_ids)
    assert 1 <= len(token_ids) <= max_tokens
    if len(token_ids) < max_tokens:
        assert eos is not None and token_ids[-1] == eos, f"stopped early without EOS: {token_ids}"


def test_json_output_shape(cli):
    out = ok_json(cli(*GREEDY))
    check_tokens(out["token_ids"], 8, DEMO_EOS)
    assert isinstance(out["text"], str)
    stats = out["stats"]
    for key in ("expert_hits", "expert_misses", "bytes_h2d"):
        assert type(stats[key]) is int and stats[key] >= 0, (key, stats[key])
    assert stats["mode"] == "paged"
    assert stats["expert_hits"] + stats["expert_misses"] > 0


@pytest.mark.parametrize(
    "extra",
    [("--mode", "resident"), ("--mode", "offload"), ("--mode", "paged", "--expert-cap", "4")],
    ids=["resident", "offload", "paged-cap4"],
)
def test_modes_give_identical_tokens(cli, extra):
    base = ok_json(cli(*GREEDY))
    other = ok_json(cli(*GREEDY, *extra))
    assert other["token_ids"] == base["token_ids"]
    assert other["text"] == base["text"]
    assert other["stats"]["mode"] == extra[1]


def test_resident_mode_moves_no_expert_bytes(cli):
    stats = ok_json(cli(*GREEDY, "--mode", "resident"))["stats"]
    assert stats["expert_misses"] == 0
    assert stats["bytes_h2d"] == 0


def test_paged_small_cap_counts_traffic(cli):
    stats = ok_json(cli(*GREEDY, "--mode", "paged", "--expert-cap", "4"))["stats"]
    assert stats["expert_cap"] == 4
    assert stats["expert_misses"] > 0
    assert stats["expert_loads"] == stats["expert_misses"]  # paged: every miss is one expert copied in
    assert stats["bytes_h2d"] == stats["expert_loads"] * DEMO_EXPERT_BYTES
    # top-4 of 16 experts in 4 MoE layers: each MoE step routes exactly top_k experts per token group
    assert stats["expert_hits"] + stats["expert_misses"] == 4 * stats["moe_steps"]


def test_sampling_is_seeded(cli, wisp_cache):
    first = ok_json(cli(*SAMPLED))
    second = run_wisp(SAMPLED, wisp_cache)  # a genuinely second process
    assert ok_json(second)["token_ids"] == first["token_ids"]
    check_tokens(first["token_ids"], 8, DEMO_EOS)
    greedy = ok_json(cli(*GREEDY))
    assert first["token_ids"] != greedy["token_ids"], "temperature 0.8 sampled exactly the greedy tokens"


def test_plain_output(cli):
    proc = cli("--model", "demo", "--prompt", "Hello", "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    greedy = ok_json(cli(*GREEDY))
    # the text is printed as is (plus print's newline); the stats line goes to stderr
    assert proc.stdout == greedy["text"] + "\n"
    assert "hits=" in proc.stderr and "misses=" in proc.stderr


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_ids_on_hf_checkpoint(cli, hf_checkpoints, family):
    out = ok_json(cli("--model", hf_checkpoints[family], "--prompt-ids", "1,2,3,4", "--max-tokens", "5",
                      "--expert-cap", "2", "--json"))
    check_tokens(out["token_ids"], 5, None)  # fixtures have no EOS: always the full length
    assert len(out["token_ids"]) == 5
    assert all(0 <= t < 128 for t in out["token_ids"])
    assert out["text"] == ""  # no tokenizer.json: no text
    assert out["stats"]["expert_cap"] == 2
    assert out["stats"]["expert_misses"] > 0
