"""wisp/cli_args.py: the size parser, the option names pinned to the engine's registries, and the rule
that building the parser loads no torch (`wisp --help` in a fresh interpreter)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from wisp import cli_args

# every parser the command line has, by its argv prefix
COMMANDS = [[], ["generate"], ["serve"], ["plan"], ["sim"], ["bench"], ["bench", "decode"], ["bench", "prefill"],
            ["bench", "serve"], ["bench", "agent"], ["bench", "soak"], ["bench", "accuracy"], ["bench", "llama-cpp"],
            *(["bench", "llama-cpp", tool] for tool in ("run", "compare", "pair", "gguf", "peak", "sampler-cost")),
            ["bench", "sweep"], *(["bench", "sweep", kind] for kind in ("moe-attention", "linear", "cpu-experts")),
            ["bench", "profile"], ["bench", "profile", "steps"], ["bench", "profile", "timeline"]]


@pytest.mark.parametrize(
    "text, value",
    [("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1e9", 10**9), ("1.5GB", 1_500_000_000), ("4096", 4096),
     ("64 KiB", 65536), ("3k", 3000)],
)
def test_parse_size(text, value):
    assert cli_args.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "2 XB", "-1GiB", "2iB", "0.1"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        cli_args.parse_size(text)


def test_option_names_match_the_engine():
    from wisp import config
    from wisp.sim.policies import POLICIES

    assert cli_args.MODES == config.MODES
    assert cli_args.MOE_BACKENDS == config.MOE_BACKENDS
    assert cli_args.ATTENTION_BACKENDS == config.ATTENTION_BACKENDS
    assert cli_args.DTYPES == tuple(config.DTYPES)
    assert cli_args.CACHE_POLICIES == POLICIES
    assert cli_args.MAX_NUM_BATCHED_TOKENS == config.EngineConfig.max_num_batched_tokens
    assert cli_args.CUDA_GRAPH_MAX_BATCH == config.EngineConfig.cuda_graph_max_batch


_HELP_WITHOUT_TORCH = """
import contextlib, io, json, sys
from wisp.cli import main
helps = {}
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*argv, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, (argv, exc.code)
    helps[" ".join(argv)] = out.getvalue()
heavy = ("wisp.engine", "wisp.core", "wisp.plan.planner", "wisp.plan.commands", "wisp.sim.commands")
print(json.dumps({"helps": helps, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy")
                                                   or m.startswith(heavy))}))
"""


def test_every_help_prints_without_loading_torch():
    run = subprocess.run([sys.executable, "-c", _HELP_WITHOUT_TORCH, json.dumps(COMMANDS)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["loaded"] == []
    for argv in COMMANDS:
        assert result["helps"][" ".join(argv)].startswith(f"usage: {' '.join(['wisp', *argv])} ")


def test_python_m_wisp_help_does_not_import_torch():
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "wisp", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("usage: wisp ")
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "wisp.cli" in imported and "torch" not in imported


@pytest.mark.parametrize("flags, model, expected", [
    ([], (), (0.0, 1.0, 0)),  # no flag, no model default: greedy
    ([], (("temperature", 0.8), ("top_p", 0.95)), (0.8, 0.95, 0)),  # the model's generation_config
    (["--temperature", "0"], (("temperature", 0.8), ("top_p", 0.95)), (0.0, 0.95, 0)),  # a flag given wins
    (["--top-k", "5", "--top-p", "0.5"], (("temperature", 0.7), ("top_k", 20.0)), (0.7, 0.5, 5)),
])
def test_generate_sampling_takes_flags_then_the_model_s_defaults(flags, model, expected):
    from wisp.cli import build_parser, sampling_params

    args = build_parser().parse_args(["generate", "--model", "demo", "--prompt", "x", *flags])
    params = sampling_params(args, model)
    assert (params.temperature, params.top_p, params.top_k) == expected
