"""The native CPU kernel's weight formats (wisp/core/kernels/native/weight_formats.h, k_quant_formats.h) widen every
code, and decode the k-quants' factors, to the same bits whatever the build: AVX-512, AVX2 with F16C, baseline x86-64 (SSE2) and the plain loops other CPUs compile
(WISP_GENERIC_WIDEN), each one compiled here from the header and run where this CPU can; and those bits are the
formats' own values (torch's float8_e4m3fn, the e2m1 table, int8)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from wisp.core.kernels.mxfp4 import E2M1

NATIVE = Path(__file__).parents[3] / "wisp" / "core" / "kernels" / "native"
DUMP = Path(__file__).with_name("weight_formats_dump.cpp")


def cpu_flags() -> set[str]:
    try:
        line = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        return set()
    return set(line.split(":", 1)[1].split())


def builds() -> list[tuple[str, list[str]]]:
    """(name, g++ flags) of the builds this CPU can run."""
    flags = cpu_flags()
    out = [("generic loops", ["-march=x86-64", "-DWISP_GENERIC_WIDEN"]), ("sse2", ["-march=x86-64"])]
    if {"avx2", "f16c", "fma", "bmi2"} <= flags:
        out.append(("avx2 + f16c", ["-march=haswell"]))
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        out.append(("avx-512", ["-march=skylake-avx512"]))
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"} <= flags:
        out.append(("avx-512 + bf16", ["-march=cooperlake"]))
    return out


def outputs_of_every_build(source: Path, folder: Path) -> dict[str, str]:
    """`source` compiled with each of `builds()` (as the kernel is: no contraction into FMAs) and run: its output per
    build (skips without g++ on an x86-64 Linux host)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None or not cpu_flags() or not Path("/proc/cpuinfo").exists():
        pytest.skip("needs g++ on an x86-64 Linux host")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{NATIVE}"]
    out = {}
    for name, flags in builds():
        binary = folder / name.replace(" ", "_").replace("+", "")
        subprocess.run([compiler, "-O2", "-std=c++17", "-ffp-contract=off", "-Wno-psabi", *flags, *includes,
                        str(source), "-o", str(binary)], check=True, capture_output=True, timeout=300)
        out[name] = subprocess.run([str(binary)], check=True, capture_output=True, text=True, timeout=60).stdout
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, str]:
    return outputs_of_every_build(DUMP, tmp_path_factory.mktemp("formats"))


def test_every_build_widens_every_code_to_the_same_bits(dumps):
    reference = dumps["generic loops"]
    assert len(reference.splitlines()) == 256 + 5 + 3 * 256 + 8 + 8 + 16
    for name, dump in dumps.items():
        assert dump == reference, name


def test_the_bits_are_the_formats_values(dumps):
    rows = [line.split() for line in dumps["generic loops"].splitlines()]
    codes = torch.arange(256, dtype=torch.uint8)
    fp8 = torch.tensor([int(r[1], 16) for r in rows[:256]], dtype=torch.int64).to(torch.int32).view(torch.float32)
    expected = codes.view(torch.float8_e4m3fn).float() * 2.0 ** -8  # the reader's scale carries the 2^8
    nan = expected.isnan()  # read as +-1.875 (the kernel is not given banks that hold them)
    assert torch.equal(fp8[~nan], expected[~nan]) and fp8[nan].tolist() == [1.875, -1.875]
    e2m1 = torch.tensor([int(r[2], 16) for r in rows[:256]], dtype=torch.int64).to(torch.int32).view(torch.float32)
    table = torch.tensor(E2M1)  # bytes 0..127 in order: the low nibble the even element
    low, high = (codes[:128] & 15).long(), (codes[:128] >> 4).long()
    assert torch.equal(e2m1, torch.stack([table[low], table[high]], dim=1).flatten())
    int8 = torch.tensor([int(r[3], 16) for r in rows[:256]], dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert torch.equal(int8, codes.view(torch.int8).float())
    powers = torch.tensor([int(r[1], 16) for r in rows[256:261]], dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert torch.equal(powers, torch.pow(2.0, torch.tensor([0, 1, 127, 254, 255]) - 127.0).float())


def test_the_k_quants_codes_are_their_values(dumps):
    """One super-block whose code bytes are (7 i + 3) mod 256: each column's code value as the kernel reads it is the
    code the reference decomposition gives (Q6_K's less 32)."""
    from tests.core.kernels.test_cpu_k_quants import parts
    from wisp.core.kernels.k_quants import K_QUANTS

    rows = [line.split() for line in dumps["generic loops"].splitlines()[261:]]
    for qtype in K_QUANTS:
        k = K_QUANTS[qtype]
        raw = torch.zeros(k.block_bytes, dtype=torch.uint8)
        raw[slice(*k.codes)] = (torch.arange(k.code_bytes) * 7 + 3).to(torch.uint8)
        want = parts(raw[None], qtype)[0][0]
        got = torch.tensor([int(r[1], 16) for r in rows if r[0] == qtype.lower()], dtype=torch.int64).to(torch.int32)
        assert torch.equal(got.view(torch.float32), want), qtype


def test_the_k_quants_factors_are_their_values(dumps):
    """A head of bytes (11 i + 5) mod 256 with d (and dmin) 0.1: each sub-block's d * scale (and dmin * min) as the
    kernel decodes them is the reference decomposition's."""
    from tests.core.kernels.test_cpu_k_quants import parts
    from wisp.core.kernels.k_quants import K_QUANTS

    def read(name: str) -> torch.Tensor:
        bits = [int(r[1], 16) for r in (line.split() for line in dumps["generic loops"].splitlines()) if r[0] == name]
        return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)

    for qtype in ("Q4_K", "Q6_K"):
        k = K_QUANTS[qtype]
        head = (torch.arange(18) * 11 + 5).to(torch.uint8)  # the dump's 18 bytes: a Q4_K head is the first 16
        head[[0, 2, 16]], head[[1, 3, 17]] = 0x66, 0x2E
        head = head[: k.head_bytes]
        raw = torch.zeros(k.block_bytes, dtype=torch.uint8)
        raw[slice(*k.heads)] = head
        _, scales, mins, _ = parts(raw[None], qtype)
        assert torch.equal(read(f"{qtype.lower()}_scale"), scales[0]), qtype
        if mins is not None:
            assert torch.equal(read(f"{qtype.lower()}_min"), mins[0]), qtype
