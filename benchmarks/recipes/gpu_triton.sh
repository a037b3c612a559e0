#!/usr/bin/env bash
# One GPU call for the Triton fused-MoE kernel: its own tests, the parity / byte-identity suite with the
# kernel in every mode, and the decode benchmark with both backends.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_triton_moe.py 2>&1 | tee "$out/pytest_triton.txt" | tail -3
python3 -m pytest -q -p no:cacheprovider tests/models tests/engine --wisp-device cuda --wisp-moe-backend triton 2>&1 \
  | tee "$out/pytest_cuda_triton.txt" | tail -3
python3 benchmarks/probes/decode_random_checkpoint.py --layers 24 --modes paged:16,resident --moe-backend triton \
  --prompt-len 32 --decode-tokens 64 --keep --out "$out/decode_qwen3_30b_a3b_24layers_triton.json" 2>&1 | grep -v '^{'
