#!/usr/bin/env bash
# GPU-machine calls for decode in every expert mode (CUDA graphs, device-side paging, zero-copy, trace replay,
# the accelerate peer), with the GPU test suite, the kernel sweep and an eager profile.
# STAGE=tests|check|attn|qwen3|mixtral|olmoe|olmoe_peer|sweep|final picks one call's worth of work; results land in $OUT (or ./gpu-out).
# The Mixtral routing trace travels in .gpu_data/ (ignored by git; pass it with the device tool's carry).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
bench() { python3 -m wisp bench decode --load-format dummy --prompt-len 128 "$@" 2>"$out/$(date +%s%N).log"; }
case "${STAGE:-tests}" in
tests)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/server --wisp-device cuda \
    --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_cuda_triton.txt" | tail -15 ;;
qwen3)
  bench --model qwen3-30b-a3b --mode resident,paged,zero-copy --expert-cap 16,32,64 --decode-tokens 128 \
    --out "$out/decode_modes_qwen3_30b_a3b.json"
  bench --model qwen3-30b-a3b --mode offload --decode-tokens 24 --out "$out/decode_offload_qwen3_30b_a3b.json" ;;
mixtral)
  t=.gpu_data/gsm8k_2_decode_TxLxK.npz
  bench --model mixtral-8x7b --mode resident,paged,zero-copy --expert-cap 2,4,6 --decode-tokens 64 --routing-trace $t \
    --out "$out/decode_modes_mixtral_8x7b_trace.json"
  bench --model mixtral-8x7b --mode offload --decode-tokens 8 --routing-trace $t --out "$out/decode_offload_mixtral_8x7b_trace.json" ;;
olmoe)
  bench --model olmoe-1b-7b --mode resident,paged,zero-copy,offload --expert-cap 8,16 --decode-tokens 128 \
    --out "$out/decode_modes_olmoe_1b_7b.json"
 ;;
olmoe_peer)  # transformers + accelerate; its random fill of 7B parameters on the CPU takes ~3 minutes
  bench --model olmoe-1b-7b --mode accelerate --peer-decode-tokens 12 --out "$out/decode_accelerate_olmoe_1b_7b.json" ;;
check)  # whole suite on the GPU, the kernel sweep, Qwen3 resident end to end, and an eager profile
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/server --wisp-device cuda \
    --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_cuda_triton.txt" | tail -15
  timeout 100 python3 -m wisp bench sweep moe-attention --out "$out/kernel_sweep.json" > "$out/kernel_sweep.txt" 2>&1
  bench --model qwen3-30b-a3b --mode resident --decode-tokens 128 --out "$out/decode_resident_qwen3_30b_a3b.json"
  grep -h decode_tok_s "$out"/decode_resident_qwen3_30b_a3b.json
  timeout 90 python3 -m wisp bench profile steps --layers 8 > "$out/profile_decode_resident_8layers.txt" 2>&1 ;;
attn)  # the span-split decode attention: its tests first (stop if they fail), the suite, the sweep, Qwen3 again
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_triton_attention.py 2>&1 \
    | tee "$out/pytest_attention.txt" | tail -5
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/server --wisp-device cuda \
    --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_cuda_triton.txt" | tail -4
  timeout 100 python3 -m wisp bench sweep moe-attention --out "$out/kernel_sweep.json" 2>&1 | grep -i "attention\|equal"
  bench --model qwen3-30b-a3b --mode resident,paged,zero-copy --expert-cap 16,32,64 --decode-tokens 128 \
    --out "$out/decode_modes_qwen3_30b_a3b.json"
  python3 -m wisp bench decode --load-format dummy --model qwen3-30b-a3b --mode resident --prompt-len 2048 \
    --decode-tokens 128 --out "$out/decode_resident_qwen3_30b_a3b_prompt2048.json" 2>/dev/null ;;
sweep)  # block sizes of the decode kernels, and the attention by context length
  python3 -m wisp bench sweep moe-attention --out "$out/kernel_sweep.json" ;;
final)  # after the kernel work: its tests on the GPU, then Qwen3-30B-A3B and OLMoE-1B-7B again
  timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/engine/test_triton_attention.py tests/core/kernels/test_triton_interpreted.py \
    tests/core/kernels/test_triton_moe.py tests/engine/decode/test_graphs.py tests/engine/test_mode_identity.py tests/models/test_hf_parity.py \
    --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_final.txt" | tail -12
  bench --model qwen3-30b-a3b --mode resident,paged,zero-copy --expert-cap 16,32,64 --decode-tokens 128 \
    --out "$out/decode_modes_qwen3_30b_a3b.json"
  bench --model olmoe-1b-7b --mode resident,paged,zero-copy --expert-cap 8,16 --decode-tokens 128 \
    --out "$out/decode_modes_olmoe_1b_7b.json" ;;
esac
