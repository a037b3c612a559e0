#!/usr/bin/env bash
# llama.cpp and wisp on one llama-quantize'd GGUF file (issue 44's pair): the file users download, the same bits on
# both sides. On the GPU machine, from the repository root, with .llama_cpp/src, .llama_cpp/COMMIT, .llama_cpp/wheels
# and .gpu_data carried (as gpu_llama_cpp.sh). Results in $OUT.
#   make: MODEL's shapes (default qwen3-30b-a3b) written as a BF16 GGUF (random weights, `wisp bench llama-cpp gguf`)
#         to GGUF_DIR (default /dev/shm) while llama-bench and llama-quantize build for sm_90, then llama-quantize to
#         QUANT (default Q4_K_M; 16 threads), the BF16 file deleted. The quantized file stays for the next steps (a warm
#         machine keeps /dev/shm between calls); made already, the step is skipped. QUANT_DIR (default GGUF_DIR) holds
#         the quantized file where the BF16 one and it do not fit together (Qwen3-30B-A3B: 61 + 19 GB).
#   peer: llama-bench on the file at PLACEMENTS (default all-cpu,half,all-gpu), prompts 512 and 2048, a 64-token decode.
#   wisp: wisp on the same file (its own weights, not dummy ones) at each placement: all-cpu, hybrid-zero-copy with no
#         hot experts; half, hybrid-zero-copy with --vram-budget HALF (bytes; auto: llama.cpp's half peak in this
#         folder's record less a bare CUDA context); all-gpu, resident. Decode 64 tokens after 512 under ROUTING
#         (default uniform; router: the file's random router; else a routing trace, e.g. OLMoE's layer-0 one under
#         .gpu_data), then cold TTFT at 512 / 2048 with no hot experts.
#   tests (not by default; first): the k-quant kernels' CUDA tests, the MoE sweep on the Q4_K / Q6_K shapes beside
#         Q8_0 and FP8 (each launch field varied, weights_first among them), and hybrid's CPU kernel on the host's
#         cores (Q4_K, Q6_K, MXFP4, Q8_0 at 1, 8 and 16 threads).
#   STEPS (default "make peer wisp") picks them: Qwen3-30B-A3B's three together take more than one call's 10 minutes
#   (the BF16 file is 61 GB): STEPS="make peer" in one call, STEPS=wisp in the next, on the same warm machine.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps .llama_cpp/wheels/*.whl 2>&1 | tail -1
model=${MODEL:-qwen3-30b-a3b}; type=bf16; quant=${QUANT:-Q4_K_M}
source benchmarks/recipes/llama_cpp/common.sh  # bench, gguf_and_build, llama_bench
dir=${GGUF_DIR:-/dev/shm}; file=${QUANT_DIR:-$dir}/$model-$quant.gguf; peer="$out/llama_cpp_${model}_$quant.json"
placements=${PLACEMENTS:-all-cpu,half,all-gpu}
note() { echo "[${SECONDS}s] $*" | tee -a "$out/summary.txt"; }
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/host.txt"; free -g >> "$out/host.txt"
steps=" ${STEPS:-make peer wisp} "
if [[ $steps == *" tests "* ]]; then  # the k-quant kernels compiled for the first time: their CUDA tests
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_k_quants.py \
    tests/models/test_packed_weights.py > "$out/pytest_k_quants_cuda.txt" 2>&1; tail -3 "$out/pytest_k_quants_cuda.txt"
  timeout 200 python3 -m wisp bench sweep moe-attention --shapes qwen3-q4_k,qwen3-q6_k,qwen3-q8_0,qwen3-fp8 \
    --no-attention --out "$out/moe_sweep_k_quants.json" > "$out/moe_sweep_k_quants.txt" 2>&1
  timeout 120 python3 -m wisp bench sweep cpu-experts --weights q4_k,q6_k,mxfp4,q8_0 --hidden 2048 --intermediate 768 \
    --experts 64 --kernels native --threads 1,8,16 --out "$out/cpu_experts_host.json" > "$out/cpu_experts_host.txt" 2>&1
fi
if [[ $steps == *" make "* ]]; then
  if [ -f "$file" ]; then note "$file is here already ($(du -h "$file" | cut -f1))"
  else
    gguf_and_build "$dir/$model-bf16.gguf"; note "BF16 GGUF written; llama-bench built"
    (time JOBS=16 BACKEND=cuda TARGET=llama-quantize bash benchmarks/recipes/llama_cpp/build.sh) >> "$out/build.txt" 2>&1
    (time .llama_cpp/build-cuda/bin/llama-quantize "$dir/$model-bf16.gguf" "$file" "$quant" 16) > "$out/quantize.log" 2>&1
    note "llama-quantize $quant: exit $? ($(du -h "$file" 2>/dev/null | cut -f1))"; tail -3 "$out/quantize.log"
    rm -f "$dir/$model-bf16.gguf"
  fi
fi
if [[ $steps == *" peer "* ]]; then
  llama_bench "${PEER_TIMEOUT:-300}" "$placements" 1 "$file" "$peer"; note "llama-bench: exit $?"
fi
if [[ $steps == *" wisp "* ]]; then
  half=${HALF:-auto}
  if [ "$half" = auto ]; then  # llama.cpp's half nvidia-smi peak, less a bare CUDA context measured here
    python3 -m wisp bench llama-cpp peak --out "$out/context.json" -- python3 -c "import torch, time
a = torch.ones(64, 64, device='cuda'); (a @ a).sum().item(); time.sleep(1)" > /dev/null 2>&1
    half=$(python3 -c "import json; half = [r for r in json.load(open('$peer')) if r['placement'] == 'half']
print(half[0]['peak_gpu_bytes'] - json.load(open('$out/context.json'))['peak_gpu_bytes'])" 2>/dev/null) || half=""
    note "HALF=auto: ${half:-no llama.cpp half record here: the half decode is skipped}"
  fi
  routing=${ROUTING:-uniform}; trace=(--routing-trace "$routing"); [ "$routing" = router ] && trace=()
  [ "$routing" = uniform ] || [ "$routing" = router ] || routing=trace  # a trace file (OLMoE's layer 0): named "trace"
  decode=(decode --model "$file" --prompt-len 512 --decode-tokens 64 "${trace[@]}")
  ours() {  # $1: the records' name, then the command's flags
    local name=$1; shift
    timeout "${WISP_TIMEOUT:-200}" python3 -m wisp bench "$@" --out "$out/$name.json" 2>"$out/$name.log" | tail -2
    note "$name: exit ${PIPESTATUS[0]}"
  }
  for placement in ${placements//,/ }; do
    case $placement in
      all-cpu) ours "decode_${model}_${quant}_all_cpu_hybrid_$routing" "${decode[@]}" --mode hybrid-zero-copy --hot-experts 0 ;;
      half) [ -n "$half" ] && ours "decode_${model}_${quant}_half_hybrid_$routing" "${decode[@]}" --mode hybrid-zero-copy \
              --vram-budget "$half" ;;
      all-gpu) ours "decode_${model}_${quant}_all_gpu_resident_$routing" "${decode[@]}" --mode resident ;;
    esac
  done
  ours "prefill_${model}_${quant}_hybrid_hot0" prefill --model "$file" --mode hybrid-zero-copy --hot-experts 0 \
    --prompt-len 512,2048
fi
# the device tool returns at most 8 files: records and the summary stay, every log travels in one archive
logs=$(cd "$out" && ls -A | grep -v -e '\.json$' -e '^summary\.txt$')
[ -n "$logs" ] && tar czf "$out.logs.tgz" -C "$out" $logs && (cd "$out" && rm -f $logs) && mv "$out.logs.tgz" "$out/logs.tgz"
ls "$out"
