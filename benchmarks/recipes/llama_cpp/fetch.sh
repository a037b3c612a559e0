#!/usr/bin/env bash
# The llama.cpp peer, step 1 (CPU machine, which reaches PyPI): llama.cpp's source from the llama-cpp-python sdist
# (it vendors the whole tree), trimmed to what a CUDA or CPU build of llama-bench needs, into .llama_cpp/ (ignored
# by git; the device call carries it), with the wheels the GPU machine lacks: gguf (the GGUF writer), nvidia-ml-py (`wisp bench llama-cpp peak`).
#   bash benchmarks/recipes/llama_cpp/fetch.sh [VERSION]     -> .llama_cpp/src, .llama_cpp/COMMIT, .llama_cpp/wheels/
set -euo pipefail
version=${1:-0.3.36}
root=$(cd "$(dirname "$0")/../../.." && pwd)
dest=$root/.llama_cpp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download -q --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
src=$tmp/llama_cpp_python-$version/vendor/llama.cpp
commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo "unknown (llama-cpp-python $version)")
# the build (build.sh) turns off tests, examples and the server, so their trees can go with the models and docs
rm -rf "$src"/.git "$src"/models "$src"/docs "$src"/media "$src"/app "$src"/benches "$src"/pocs "$src"/gguf-py \
  "$src"/tests "$src"/examples "$src"/tools/ui "$src"/tools/server "$src"/tools/cli
for backend in "$src"/ggml/src/ggml-*/; do  # keep the CPU and CUDA backends (and BLAS, referenced by cmake)
  case $(basename "$backend") in ggml-cpu|ggml-cuda|ggml-blas) ;; *) rm -rf "$backend" ;; esac
done
mkdir -p "$dest"
rm -rf "$dest/src"
mv "$src" "$dest/src"
echo "$commit" > "$dest/COMMIT"
echo "llama-cpp-python $version" > "$dest/SOURCE"
pip download -q --no-deps gguf nvidia-ml-py -d "$dest/wheels"
du -sh "$dest"
