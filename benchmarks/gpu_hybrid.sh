#!/usr/bin/env bash
# Hybrid mode on the GPU machine: its tests under CUDA (close to resident, counters), then batch-1 decode, paged
# against hybrid, on the OLMoE-1B-7B preset (dummy weights) with OLMoE's real layer-0 routing replayed for every
# layer (an approximation). Results in $OUT (or ./gpu-out); the trace travels in .gpu_data/ (carry it).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/core/test_hybrid_experts.py tests/engine/test_hybrid_mode.py ${MORE_TESTS:-} \
  --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_hybrid_cuda.txt" | tail -3
timeout ${DECODE_TIMEOUT:-200} python3 -m wisp bench decode --model olmoe-1b-7b --load-format dummy --mode paged,hybrid \
  --expert-cap ${CAPS:-8,16} --decode-tokens ${TOKENS:-64} --routing-trace .gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl \
  --out "$out/decode_hybrid_olmoe.json" 2>"$out/decode_hybrid_olmoe.log" | tee "$out/decode_hybrid_olmoe.txt"
