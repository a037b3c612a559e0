#!/usr/bin/env bash
# GPT-OSS on the GPU machine (README "Families and weight formats"). STAGE picks one call's worth of work;
# results in $OUT (or ./gpu-out).
#   tests: GPT-OSS's and MXFP4's tests under CUDA, Triton and torch MoE kernels (MXFP4 dequantized in-kernel,
#          attention sinks in the Triton attention), about 2 minutes.
#   bench: gpt-oss-120b preset (dummy MXFP4 experts, random router: say so), batch 1: paged at the cap a
#          16 GiB budget allows, zero-copy and offload beside it (issue 15's target).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
case "${STAGE:-tests}" in
tests)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  for backend in triton torch; do
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/models/test_gpt_oss_mxfp4.py tests/models/test_hf_parity.py \
      tests/core/kernels/test_quantized_experts.py tests/engine/test_triton_attention.py -k "gpt_oss or mxfp4 or sinks or quantized" \
      --wisp-device cuda --wisp-moe-backend $backend --wisp-attention-backend triton 2>&1 \
      | tee "$out/pytest_gpt_oss_cuda_$backend.txt" | tail -3
  done ;;
bench)
  for mode in ${MODES:-paged zero-copy offload}; do
    timeout "${DECODE_TIMEOUT:-200}" python3 -m wisp bench decode --load-format dummy --model gpt-oss-120b --mode $mode \
      --vram-budget 16GiB --prompt-len 128 --decode-tokens ${TOKENS:-32} --out "$out/decode_gpt_oss_120b_$mode.json" \
      2>"$out/gpt_oss_120b_$mode.log" | tail -3
  done ;;
esac
