#!/usr/bin/env bash
# Issue 16: llama.cpp with experts on the CPU, in our harness, on the GPU machine. Needs .llama_cpp/ from
# `bash benchmarks/llama_cpp/fetch.sh` on the CPU machine; carry .llama_cpp/src, .llama_cpp/COMMIT,
# .llama_cpp/wheels and .gpu_data (not a local build-cpu folder). Results in $OUT.
#   peer: build llama-bench for sm_90 while the GGUF (MODEL, TYPE) is written to local disk, then llama-bench at
#         the three placements (benchmarks/llama_cpp/run_peer.py), then delete the GGUF. About 8 minutes.
#   wisp: our modes on the same preset with OLMoE's real layer-0 routing replayed, at the VRAM budget BUDGET
#         (llama.cpp's all-experts-on-CPU peak), decode and TTFT at 512 / 2048 tokens.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
model=${MODEL:-olmoe-1b-7b}; type=${TYPE:-bf16}
case "${STAGE:-peer}" in
peer)
  pip install -q --no-index .llama_cpp/wheels/gguf-*.whl 2>&1 | tail -1
  gguf=/tmp/$model-$type.gguf
  (time python3 benchmarks/llama_cpp/gguf_random.py --model "$model" --type "$type" --out "$gguf") > "$out/gguf.log" 2>&1 &
  writer=$!
  (time JOBS=16 BACKEND=cuda bash benchmarks/llama_cpp/build.sh) > "$out/build.txt" 2>&1
  cp .llama_cpp/build-cuda.log "$out/" 2>/dev/null
  wait $writer; tail -4 "$out/gguf.log"; tail -4 "$out/build.txt"
  timeout "${PEER_TIMEOUT:-300}" python3 benchmarks/llama_cpp/run_peer.py --bench .llama_cpp/build-cuda/bin/llama-bench \
    --gguf "$gguf" --model "$model" --placements "${PLACEMENTS:-all-cpu,half,all-gpu}" --prompts 512,2048 \
    --decode-tokens 64 --repetitions 2 --extra "-t 16" --out "$out/llama_cpp_${model}_${type}.json" 2>&1 | tail -6
  rm -f "$gguf" ;;
wisp)
  trace=.gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl
  cap=$(python3 -c "from wisp.cli_args import parse_size; from wisp.config import ModelConfig; from wisp.models.presets import preset
from wisp.plan.sizes import cap_for_budget; print(cap_for_budget(ModelConfig.from_hf(preset('$model')), parse_size('${BUDGET:?BUDGET: llama.cpp all-cpu peak}'), 2112))")
  echo "cap for $BUDGET: $cap"
  timeout 280 python3 -m wisp bench decode --load-format dummy --model "$model" --mode ${MODES:-paged,hybrid,zero-copy} \
    --expert-cap "$cap" --prompt-len 512 --decode-tokens 64 --routing-trace $trace \
    --out "$out/decode_${model}_vs_llama_cpp.json" 2>"$out/wisp_decode.log" | tail -6
  timeout 240 python3 -m wisp bench prefill --load-format dummy --model "$model" --mode paged --expert-cap "$cap" \
    --prompt-len 512,2048 --out "$out/prefill_${model}_vs_llama_cpp.json" 2>"$out/wisp_prefill.log" | tail -6 ;;
esac
