"""The native kernel's dot products (wisp/core/kernels/native/row_dots.h's block_dot) give the same bits in every
build this CPU can run (generic loops, SSE2, AVX2, AVX-512: 16 lanes as one register, two or four), for every format,
and a row's bits do not depend on the rows computed beside it (8 a call or one), on the dump's data (row_dots_dump.cpp:
fixed pseudo-random codes, scales and x), finite and distinct."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from tests.core.kernels.test_weight_formats_builds import outputs_of_every_build

DUMP = Path(__file__).with_name("row_dots_dump.cpp")
FORMATS = ("bf16", "fp8", "mxfp4", "q8_0", "q4_k", "q4_k_bf16_x", "q5_k", "q6_k")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, str]:
    return outputs_of_every_build(DUMP, tmp_path_factory.mktemp("row_dots"))


def _sums(dump: str) -> str:
    return "\n".join(line for line in dump.splitlines() if not line.startswith("pairs"))


def test_every_build_computes_every_formats_dots_to_the_same_bits(dumps):
    reference = _sums(dumps["generic loops"])
    rows = [line.split() for line in reference.splitlines()]
    assert [r[0] for r in rows] == [f for f in FORMATS for _ in range(8)]
    values = [struct.unpack("<f", bytes.fromhex(r[2])[::-1])[0] for r in rows]
    assert all(math.isfinite(v) for v in values) and len(set(values)) == len(values)  # distinct sums, none NaN
    for name, dump in dumps.items():
        assert _sums(dump) == reference, name


def test_bfloat16_pairs_are_taken_only_where_their_sums_are_the_loops(dumps):
    """An AVX512-BF16 build sums Q4_K on bfloat16 x with vdpbf16ps (the dump's q4_k_bf16_x, equal above in every build)
    only where x is bfloat16, finite and 0 or at least 2^-100 in magnitude; other builds never."""
    for name, dump in dumps.items():
        line = next(line for line in dump.splitlines() if line.startswith("pairs"))
        #                 0, -0, 2^-100, 2^-101, not bf16, inf
        expected = "pairs 1 1 1 0 0 0" if "bf16" in name else "pairs 0 0 0 0 0 0"
        assert line == expected, name


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(dumps):
    for line in _sums(dumps["generic loops"]).splitlines():
        _, _, together, alone = line.split()
        assert together == alone, line
