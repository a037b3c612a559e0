#!/usr/bin/env bash
# One GPU-machine call: the parity / byte-identity suite on CUDA (pinned masters), then the decode benchmark
# of a Qwen3-30B-A3B-shaped random checkpoint (24 layers by default). Results land in $OUT (or ./gpu-out when
# run by hand).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/server --wisp-device cuda 2>&1 | tee "$out/pytest_cuda.txt" | tail -5
python3 benchmarks/probes/decode_random_checkpoint.py --layers "${LAYERS:-24}" --modes "${MODES:-paged:16,paged:32,paged:64,resident,offload}" \
  --prompt-len 32 --decode-tokens "${DECODE:-64}" --out "$out/decode_qwen3_30b_a3b_${LAYERS:-24}layers_torch.json" 2>&1 | tee "$out/bench.txt" | grep -v '^{'
