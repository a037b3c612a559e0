"""Command-line failures that used to end in a traceback: each is one `wisp: error:` line on stderr and exit 2.

Traces are written here (`RoutingTrace.save`, in the demo model's shape: 4 layers, top-4 of 16 experts) and then
broken: cut short, emptied, given fractional ids, or given to a model they do not fit. Outputs go to folders that
do not exist. `wisp sim` writes into a pipe whose reader has left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import PLAN_COSTS, run_many
from tests.test_bad_input import assert_one_line_error
from wisp.trace.format import RoutingTrace

PLAN = ["--model", "demo", "--vram-budget", "48MiB", "--max-model-len", "512", "--reserve", "1MiB", "--device", "cpu",
        *PLAN_COSTS]


def demo_trace(tokens: int, seed: int = 0) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.permutation(16)[:4] for _ in range(4)] for _ in range(tokens)]).reshape(tokens, 4, 4)
    return RoutingTrace(ids, num_experts=16, metadata={"model": "demo"})


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("traces")
    good = root / "good.npz"
    demo_trace(24).save(good)
    truncated = root / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    empty = root / "empty.npz"
    RoutingTrace(np.zeros((0, 4, 4), dtype=np.int16), num_experts=16).save(empty)
    fractional, whole = root / "fractional.npz", root / "whole.npz"
    ids = demo_trace(8).ids.astype(np.float64)
    np.savez(whole, ids=ids, layers=np.arange(4))
    ids[3, 1, 2] = 2.5
    np.savez(fractional, ids=ids, layers=np.arange(4))
    binary = root / "bytes.bin"
    binary.write_bytes(b"\x80\xff not text")
    return {"good": good, "truncated": truncated, "empty": empty, "fractional": fractional, "whole": whole,
            "folder": root, "binary": binary}


CASES = {  # name: (command, args with TRACE / MISSING for the paths, fragments of the error line)
    "plan-truncated": ("plan", ["--trace", "truncated", *PLAN], ("truncated.npz", "not a whole .npz")),
    "sim-truncated": ("sim", ["--trace", "truncated"], ("truncated.npz", "not a whole .npz")),
    "plan-empty": ("plan", ["--trace", "empty", *PLAN], ("holds no tokens",)),
    "sim-empty": ("sim", ["--trace", "empty"], ("holds no tokens",)),
    "plan-folder": ("plan", ["--trace", "folder", *PLAN], ("is a folder",)),
    "sim-fractional": ("sim", ["--trace", "fractional"], ("whole numbers", "2.5")),
    "plan-other-model": ("plan", ["--trace", "good", *PLAN[:1], "qwen3-30b-a3b", *PLAN[2:]],
                         ("top-4", "qwen3-30b-a3b routes top-8")),
    "plan-out": ("plan", ["--trace", "good", *PLAN, "--out", "MISSING/plan.json"], ("--out", "does not exist")),
    "plan-plot": ("plan", ["--trace", "good", *PLAN, "--plot", "MISSING/plan.png"], ("--plot", "does not exist")),
    "sim-json": ("sim", ["--trace", "good", "--json", "MISSING/sim.json"], ("--json", "does not exist")),
    "sim-plot": ("sim", ["--trace", "good", "--plot", "MISSING/sim.png"], ("--plot", "does not exist")),
    # `wisp bench perplexity`: the text, the window and the routing file are checked before the model loads
    "perplexity-folder": ("bench", ["perplexity", "--text", "folder", "--device", "cpu"], ("--text", "directory")),
    "perplexity-binary": ("bench", ["perplexity", "--text", "binary", "--device", "cpu"], ("not UTF-8",)),
    "perplexity-missing": ("bench", ["perplexity", "--text", "MISSING/t.txt", "--device", "cpu"], ("no such file",)),
    "perplexity-window": ("bench", ["perplexity", "--window", "1", "--device", "cpu"], ("--window 1", "at least 2")),
    "perplexity-long-window": ("bench", ["perplexity", "--window", "2048", "--device", "cpu"],
                               ("--window 2048", "2048 positions", "2047 or less")),
    "perplexity-routing-name": ("bench", ["perplexity", "--record-routing", "binary", "--device", "cpu"],
                                ("--record-routing", ".npz or .jsonl")),
}


@pytest.fixture(scope="module")
def runs(traces, tmp_path_factory):
    cache, missing = tmp_path_factory.mktemp("cache"), tmp_path_factory.mktemp("out") / "not-made"

    def path(arg: str) -> str:
        return str(traces[arg]) if arg in traces else arg.replace("MISSING", str(missing))

    by_command: dict[str, dict] = {}
    for name, (command, args, _) in CASES.items():
        by_command.setdefault(command, {})[name] = [path(a) for a in args]
    found = {}
    for command, cases in by_command.items():
        found.update(run_many(cases, cache, command=command))
    found["sim-whole"] = run_many({"w": ["--trace", traces["whole"]]}, cache, command="sim")["w"]
    return found


@pytest.mark.parametrize("name", CASES)
def test_each_failure_is_one_line_and_exit_2(runs, name):
    assert_one_line_error(runs[name], *CASES[name][2])


def test_whole_float_ids_are_read_as_integers(runs):
    assert runs["sim-whole"].returncode == 0, runs["sim-whole"].stderr
    assert "trace: 8 tokens, 4 layers, 16 experts, top-4" in runs["sim-whole"].stdout


def test_a_reader_that_leaves_early_gets_one_line_not_a_traceback(traces, tmp_path):
    """`wisp sim ... | head`: here the reader leaves before wisp writes anything."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "wisp", "sim", "--trace", str(traces["good"])], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=300, env=dict(os.environ, WISP_CACHE=str(tmp_path)))
    os.close(write)
    assert "Traceback" not in proc.stderr and proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["wisp: error: stdout was closed before all of the output was written "
                                        "(broken pipe)"]
