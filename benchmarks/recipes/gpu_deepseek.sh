#!/usr/bin/env bash
# DeepSeek-V2-Lite on the GPU machine (README "Families and weight formats"), one call (about 6 minutes):
# its HF-parity tests under CUDA (both MoE backends) and the Triton latent attention's tests (against the torch path,
# decode launch = prefill bits, batch invariance, graph replay = eager), then the deepseek-v2-lite preset (dummy
# weights, random router: say so) on the Triton latent attention with CUDA graphs, batch 1, resident and paged at
# C = 16 and 32, resident at batch 8, and resident on the torch attention (no graphs: the path before the latent
# kernels) for comparison. Results in $OUT (or ./gpu-out).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for backend in triton torch; do
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/models/test_hf_parity.py -k deepseek \
    --wisp-device cuda --wisp-moe-backend $backend --wisp-attention-backend triton 2>&1 \
    | tee "$out/pytest_deepseek_cuda_$backend.txt" | tail -2
done
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_mla_attention.py \
  "tests/engine/decode/test_graphs.py::test_latent_attention_decodes_from_graphs_with_the_eager_bits" 2>&1 \
  | tee "$out/pytest_mla_attention_cuda.txt" | tail -2
bench() { timeout "${DECODE_TIMEOUT:-240}" python3 -m wisp bench decode --load-format dummy --model deepseek-v2-lite \
  --prompt-len 128 --decode-tokens ${TOKENS:-32} "$@" 2>>"$out/deepseek_v2_lite.log" | tail -6; }
bench --mode resident,paged --expert-cap 16,32 --out "$out/decode_deepseek_v2_lite.json"
bench --mode resident --batch 8 --out "$out/decode_deepseek_v2_lite_batch8.json"
bench --mode resident --attention-backend torch --out "$out/decode_deepseek_v2_lite_torch_attention.json"
