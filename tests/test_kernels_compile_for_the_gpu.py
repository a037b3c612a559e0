"""Every Triton kernel family compiles for the H200 (sm_90), on any machine: the interpreter the CPU tests run them
under type-checks nothing, so a kernel that no GPU could compile passed them (`tests/kernels_compiled_for_the_gpu.py`
says how, and why)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


@pytest.mark.slow
def test_every_kernel_family_compiles_for_the_h200():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, said aloud (it warns otherwise)
    run = subprocess.run([sys.executable, "-m", "tests.kernels_compiled_for_the_gpu"], cwd=Path(__file__).parents[1],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = run.stdout.splitlines()
    assert lines and all(line.split(": ", 1)[1] for line in lines), run.stdout  # each call compiled something
    compiled = set(", ".join(line.split(": ", 1)[1] for line in lines).split(", "))
    assert {"_gate_up_act", "_down", "_sort_few_pairs", "_linear", "_add_rms_norm", "_qkv_heads", "_span_partials",
            "_merge_spans", "_paged_attn", "_latent_attn", "_count_step", "_gather_rows", "_lru_decide",
            "_copy_misses"} <= compiled, compiled
