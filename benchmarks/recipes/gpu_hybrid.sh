#!/usr/bin/env bash
# Hybrid mode on the GPU machine (docs/hybrid.md). STAGE picks one call's worth of work; results in $OUT (or
# ./gpu-out). The routing traces travel in .gpu_data/ (ignored by git; pass it with the device tool's carry).
#   tests:   hybrid's tests under CUDA (the store's side stream and copies, close to resident), then batch-1
#            decode on the OLMoE-1B-7B preset (dummy weights) with OLMoE's real layer-0 routing replayed for
#            every layer (an approximation), paged against hybrid at C = 8 and 16 (the first run, 685d7ad).
#   mixtral: the target: Mixtral-8x7B preset with the real all-layer GSM8K decode trace, batch 1,
#            paged / hybrid / zero-copy at C = 2, 4, 6 (hybrid >= 1.4x paged at C = 2 and 4, not slower at 6).
#   noslots: hybrid with no slots (--expert-cap 0: the GPU reads in place what the CPU does not compute) against
#            zero-copy on Mixtral-8x7B with the real GSM8K trace, batch 1, with CUDA graphs (the chooser) and
#            eager; hybrid's CUDA tests first (about 5 minutes).
#   qwen3:   Qwen3-30B-A3B preset (random router: say so), paged against hybrid at C = 8 and 16.
#   rest:    what issue 14 still lacks after f3be815 (about 5 minutes): hybrid's max logit difference and
#            greedy agreement on the GPU (OLMoE shapes, dummy weights, 4 x 128 tokens), then qwen3.
#   prefetch46: prefetch at C = 4 and 6 beside paged eager at the same caps (about 5 minutes).
#   prefetch: Mixtral-8x7B with the real GSM8K trace, batch 1, paged eager with and without --prefetch at
#            C = 2, 4, 6 (docs/prefetch.md; the paper saw -38% at cap 8); PREFETCH_ONLY=1 skips the former.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
bench() { name=$1; shift; timeout "${DECODE_TIMEOUT:-400}" python3 -m wisp bench decode --load-format dummy --prompt-len 128 \
  "$@" --out "$out/$name.json" 2>"$out/$name.log" | tee "$out/$name.txt"; }
case "${STAGE:-tests}" in
tests)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -x -p no:cacheprovider tests/core/experts/test_hybrid_experts.py \
    tests/core/learners/test_hybrid_pace.py tests/engine/test_hybrid_mode.py \
    ${MORE_TESTS:-} --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 \
    | tee "$out/pytest_hybrid_cuda.txt" | tail -3
  bench decode_hybrid_olmoe --model olmoe-1b-7b --mode paged,hybrid --expert-cap ${CAPS:-8,16} \
    --decode-tokens ${TOKENS:-64} --routing-trace .gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl ;;
mixtral)
  bench decode_hybrid_mixtral_8x7b_trace --model mixtral-8x7b --mode ${MODES:-paged,hybrid,zero-copy} --expert-cap 2,4,6 \
    --decode-tokens ${TOKENS:-64} --routing-trace .gpu_data/gsm8k_2_decode_TxLxK.npz ;;
noslots)
  timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -x -p no:cacheprovider tests/core/experts/test_hybrid_experts.py \
    tests/engine/test_hybrid_mode.py --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 \
    | tee "$out/pytest_hybrid_cuda.txt" | tail -3
  t=.gpu_data/gsm8k_2_decode_TxLxK.npz
  bench decode_no_slots_mixtral_8x7b_trace --model mixtral-8x7b --mode zero-copy,hybrid --expert-cap 0 \
    --decode-tokens ${TOKENS:-32} --routing-trace $t
  bench decode_no_slots_eager_mixtral_8x7b_trace --model mixtral-8x7b --mode zero-copy,hybrid --expert-cap 0 \
    --enforce-eager --decode-tokens ${TOKENS:-32} --routing-trace $t ;;
prefetch)
  t=.gpu_data/gsm8k_2_decode_TxLxK.npz
  [ -n "${PREFETCH_ONLY:-}" ] || bench decode_paged_eager_mixtral_8x7b_trace --model mixtral-8x7b --mode paged \
    --expert-cap 2,4,6 --enforce-eager --decode-tokens ${TOKENS:-64} --routing-trace $t
  bench decode_prefetch_mixtral_8x7b_trace --model mixtral-8x7b --mode paged --expert-cap 2,4,6 --prefetch \
    --decode-tokens ${TOKENS:-64} --routing-trace $t ;;
qwen3)
  bench decode_hybrid_qwen3_30b_a3b --model qwen3-30b-a3b --mode paged,hybrid --expert-cap 8,16 \
    --decode-tokens ${TOKENS:-64} ;;
rest)
  timeout 150 python3 -m wisp bench accuracy --model olmoe-1b-7b --load-format dummy --device cuda --expert-cap 8 \
    --prompts 4 --decode-tokens 128 --out "$out/hybrid_accuracy_gpu_olmoe.json" 2>&1 | tail -8
  DECODE_TIMEOUT=120 STAGE=qwen3 bash "$0" ;;
prefetch46)
  t=.gpu_data/gsm8k_2_decode_TxLxK.npz
  DECODE_TIMEOUT=200 bench decode_prefetch_mixtral_8x7b_trace_c4_c6 --model mixtral-8x7b --mode paged --expert-cap 4,6 \
    --enforce-eager --decode-tokens 64 --routing-trace $t
  DECODE_TIMEOUT=200 bench decode_prefetch_on_mixtral_8x7b_trace_c4_c6 --model mixtral-8x7b --mode paged --expert-cap 4,6 \
    --prefetch --decode-tokens 64 --routing-trace $t ;;
esac
