#!/usr/bin/env bash
# DeepSeek-V2-Lite on the GPU machine (README "Families and weight formats"), one call (about 4 minutes):
# its HF-parity tests under CUDA (both MoE backends), then the deepseek-v2-lite preset (dummy weights, random
# router: say so), batch 1, resident and paged at C = 16 and 32. Results in $OUT (or ./gpu-out).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for backend in triton torch; do
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/models/test_hf_parity.py -k deepseek \
    --wisp-device cuda --wisp-moe-backend $backend --wisp-attention-backend triton 2>&1 \
    | tee "$out/pytest_deepseek_cuda_$backend.txt" | tail -2
done
timeout "${DECODE_TIMEOUT:-240}" python3 -m wisp bench decode --load-format dummy --model deepseek-v2-lite \
  --mode resident,paged --expert-cap 16,32 --prompt-len 128 --decode-tokens ${TOKENS:-32} \
  --out "$out/decode_deepseek_v2_lite.json" 2>"$out/deepseek_v2_lite.log" | tail -6
