# The llama.cpp recipes' shared steps (sourced by benchmarks/recipes/gpu_llama_cpp.sh and gpu_gguf_quantized.sh, from
# the repository root, with out, model and type set): where llama-bench is built, the GGUF written beside its build,
# and llama-bench run through `wisp bench llama-cpp run`.
bench=.llama_cpp/build-cuda/bin/llama-bench
gguf_and_build() {  # $1: the GGUF's path. Writes it (MODEL, TYPE; log: gguf.log) while llama-bench builds (build.txt;
  # skipped where a warm machine still has it); returns the writer's exit status. A file left there is removed first
  # (the writer's room check counts it as taken).
  df -h /tmp /dev/shm | tail -2; rm -f "$1"
  (time python3 -m wisp bench llama-cpp gguf --model "$model" --type "$type" --out "$1") > "$out/gguf.log" 2>&1 &
  local writer=$! rc
  if [ -x "$bench" ]; then echo "llama-bench already built" > "$out/build.txt"
  else (time JOBS=16 BACKEND=cuda bash benchmarks/recipes/llama_cpp/build.sh) > "$out/build.txt" 2>&1; cp .llama_cpp/build-cuda.log "$out/" 2>/dev/null
  fi
  wait $writer; rc=$?; tail -4 "$out/gguf.log"; tail -4 "$out/build.txt"; df -h "$(dirname "$1")" | tail -1
  return $rc
}
llama_bench() {  # $1: timeout (s), $2: placements, $3: repetitions, $4: the GGUF, $5: the records' file. llama-bench
  # (`wisp bench llama-cpp run`) at prompts 512 and 2048 and a 64-token decode, 16 threads plus LLAMA_EXTRA's flags
  timeout "$1" python3 -m wisp bench llama-cpp run --llama-bench "$bench" --gguf "$4" --model "$model" \
    --placements "$2" --prompts 512,2048 --decode-tokens 64 --repetitions "$3" --extra "-t 16${LLAMA_EXTRA:+ $LLAMA_EXTRA}" \
    ${UNSAMPLED:+--unsampled-decode} --out "$5" 2>&1 | tail -6
  return "${PIPESTATUS[0]}"  # the run's status, not tail's
}
