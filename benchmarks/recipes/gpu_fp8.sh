#!/usr/bin/env bash
# FP8 block-scaled experts on the GPU machine (README "Families and weight formats"). One call (about 6 min):
# 1. the FP8 tests under CUDA with the Triton kernels (in-kernel dequantization compiled for the first time)
#    and with the torch ones;
# 2. qwen3-30b-a3b-fp8 against qwen3-30b-a3b, dummy weights (random router: say so), paged at C = 16 and 32,
#    Triton kernels and CUDA graphs: bytes per token should halve; tok/s side by side.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for backend in triton torch; do
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_quantized_experts.py tests/models/test_fp8_checkpoint.py \
    --wisp-device cuda --wisp-moe-backend $backend --wisp-attention-backend triton 2>&1 | tee "$out/pytest_fp8_cuda_$backend.txt" | tail -3
done
for model in qwen3-30b-a3b-fp8 qwen3-30b-a3b; do
  timeout 170 python3 -m wisp bench decode --load-format dummy --prompt-len 128 --model $model --mode paged \
    --expert-cap 16,32 --decode-tokens 64 --moe-backend triton --out "$out/decode_paged_$model.json" 2>"$out/$model.log" | tail -4
done
