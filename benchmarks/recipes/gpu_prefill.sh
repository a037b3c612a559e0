#!/usr/bin/env bash
# GPU-machine calls for expert-major prefill, chunked prefill and batched decode (one H200).
# STAGE=qwen3|olmoe_mixtral|decode|mixtral_decode picks one call's worth of work; results land in $OUT (or ./gpu-out).
# The Mixtral routing trace travels in .gpu_data/ (ignored by git; pass it with the device tool's carry).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log() { echo "$out/$1.log"; }
prefill() { name=$1; shift; python3 -m wisp bench prefill --load-format dummy --out "$out/$name.json" "$@" 2>"$(log $name)"; }
decode() { name=$1; shift; python3 -m wisp bench decode --load-format dummy --prompt-len 128 --out "$out/$name.json" "$@" \
  2>"$(log $name)"; }
case "${STAGE:-qwen3}" in
qwen3)  # the wide-step tests on the GPU (stop if they fail), then Qwen3-30B-A3B prefill and its baselines
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/core/kernels/test_triton_interpreted.py tests/core/kernels/test_triton_moe.py \
    tests/engine/test_chunked_prefill.py tests/engine/test_mode_identity.py tests/engine/decode/test_graphs.py \
    --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_prefill_cuda.txt" | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  prefill prefill_qwen3_30b_a3b --model qwen3-30b-a3b --mode resident,paged --expert-cap 16,32 --prompt-len 128,512,2048,8192 \
    --plot "$out/prefill_qwen3_30b_a3b.png"
  prefill prefill_qwen3_30b_a3b_baselines --model qwen3-30b-a3b --mode zero-copy,offload --prompt-len 128,512,2048 ;;
olmoe_mixtral)  # OLMoE prefill (its context is 4096) and Mixtral-8x7B prefill at C = 4 / 6 (about 8 minutes)
  prefill prefill_olmoe_1b_7b --model olmoe-1b-7b --mode resident,paged,zero-copy,offload --expert-cap 8,21 \
    --prompt-len 128,512,2048,4000 --plot "$out/prefill_olmoe_1b_7b.png"
  prefill prefill_mixtral_8x7b --model mixtral-8x7b --mode resident,paged --expert-cap 4,6 --prompt-len 128,1024 ;;
decode)  # Qwen3 decode at batch 1 (the old rows' prompt), 4 and 8 (wide batches run expert-major), one process (pinned
  # memory reused), then P = 8192 prefilled in one step (budget 8192) against the default chunks of 2048
  decode decode_qwen3_30b_a3b_batched --model qwen3-30b-a3b --mode resident,paged --expert-cap 16,32 --batch 1,4,8 \
    --decode-tokens 128
  for budget in 2048 8192; do
    prefill prefill_qwen3_30b_a3b_8192_budget$budget --model qwen3-30b-a3b --mode paged --expert-cap 16 --prompt-len 8192 \
      --max-num-batched-tokens $budget
  done ;;
mixtral_decode)  # Mixtral-8x7B decode with the real trace, resident in the same run for the roofline
  decode decode_mixtral_8x7b_trace --model mixtral-8x7b --mode resident,paged --expert-cap 4,6 --decode-tokens 64 \
    --routing-trace .gpu_data/gsm8k_2_decode_TxLxK.npz ;;
esac
