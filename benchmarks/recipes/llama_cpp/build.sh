#!/usr/bin/env bash
# The llama.cpp peer, step 2: build llama-bench from .llama_cpp/src (benchmarks/recipes/llama_cpp/fetch.sh) into
# .llama_cpp/build-$BACKEND. BACKEND=cuda on the GPU machine (sm_90: 220 s at -j 16 measured, 350 s beside a GGUF writer), cpu to check the
# harness on the CPU machine. TARGET: another of its programs (llama-quantize: tests/models/make_q4_k_m_fixture.py).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
backend=${BACKEND:-cuda}
src=$root/.llama_cpp/src
build=$root/.llama_cpp/build-$backend
flags=(-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
       -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_COMMIT="$(cat "$root/.llama_cpp/COMMIT")")
if [ "$backend" = cuda ]; then flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); else flags+=(-DGGML_CUDA=OFF); fi
cmake -S "$src" -B "$build" -G Ninja "${flags[@]}" > "$build.configure.log" 2>&1 || { tail -20 "$build.configure.log"; exit 1; }
cmake --build "$build" --target "${TARGET:-llama-bench}" -j "${JOBS:-$(nproc)}" > "$build.log" 2>&1 || { tail -30 "$build.log"; exit 1; }
echo "$build/bin/${TARGET:-llama-bench}"
