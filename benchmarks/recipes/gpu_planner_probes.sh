#!/usr/bin/env bash
# One GPU-machine call: the whole suite on CUDA, a routing trace from a Qwen3-30B-A3B-shaped random
# checkpoint (8 layers), the planner's cost probes, and the decode benchmark on the final engine.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/server --wisp-device cuda -x 2>&1 | tee "$out/pytest_cuda.txt" | tail -3
python3 - <<'PY' 2>&1 | tee "$out/probes.txt"
import torch
from wisp.models.config_parsers import model_config
from wisp.models.presets import preset
from wisp.plan.probes import estimate_recompute_cost, probe_seconds_per_byte
dev = torch.device("cuda")
cfg = model_config(preset("qwen3-30b-a3b"))
t = probe_seconds_per_byte(dev, 1 << 30)
print(f"t_byte {t:.4e} s/B = {1 / t / 1e9:.1f} GB/s; recompute_cost {estimate_recompute_cost(cfg, dev):.4e} s/token")
PY
python3 -c "
from wisp.models.presets import preset
from wisp.models.random_checkpoint import write_random_checkpoint
write_random_checkpoint(dict(preset('qwen3-30b-a3b'), num_hidden_layers=8), '/tmp/q3', device='cuda')"
ids=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(151000)) for _ in range(64)))")
python3 -m wisp generate --model /tmp/q3 --device cuda --dtype bfloat16 --prompt-ids "$ids" --max-tokens 128 \
  --temperature 1.0 --seed 0 --expert-cap 16 --record-routing "$out/qwen3_shape_random_8layer_trace.npz" --json \
  | python3 -c "import json,sys; d=json.load(sys.stdin); print({k: d['stats'][k] for k in ('expert_hits','expert_misses','hit_rate','bytes_h2d')})"
rm -rf /tmp/q3
python3 benchmarks/probes/decode_random_checkpoint.py --layers 24 --modes paged:16,paged:32,resident,offload \
  --prompt-len 32 --decode-tokens 64 --out "$out/decode_qwen3_30b_a3b_24layers_torch.json" 2>&1 | tee "$out/bench.txt" | grep -v '^{'
