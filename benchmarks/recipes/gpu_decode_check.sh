#!/usr/bin/env bash
# A short no-regression check after a change that should not move decode: one Qwen3 row and one Mixtral
# real-trace row (compare with decode_qwen3_30b_a3b_128tokens.json / decode_mixtral_8x7b_trace.json), then
# the core, engine, models and trace tests on CUDA with both Triton backends. About 4.5 minutes on an H200.
# The Mixtral trace travels in .gpu_data/ (cp ../shared/data/routing_mixtral8x7b/gsm8k_2_decode_TxLxK.npz .gpu_data/).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 110 python3 -m wisp bench decode --load-format dummy --prompt-len 128 --model qwen3-30b-a3b --mode paged --expert-cap 16 \
  --decode-tokens 128 --out "$out/check_qwen3.json" 2>"$out/check_qwen3.log" | tail -3
timeout 100 python3 -m wisp bench decode --load-format dummy --prompt-len 128 --model mixtral-8x7b --mode paged --expert-cap 4 \
  --decode-tokens 64 --routing-trace .gpu_data/gsm8k_2_decode_TxLxK.npz --out "$out/check_mixtral.json" 2>"$out/check_mixtral.log" | tail -3
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core tests/engine tests/models tests/trace -x \
  --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton > "$out/pytest_check_cuda.txt" 2>&1
tail -3 "$out/pytest_check_cuda.txt"
