#!/usr/bin/env bash
# The GPU soak (RELIABILITY.md ## Soak): `wisp bench soak` for MINUTES (10) against `wisp serve` on one H200,
# live resizes included. The model: the olmoe-1b-7b preset's shapes with random (dummy) weights, but with the
# demo model's byte-level tokenizer and a vocabulary cut to it (259 ids, so every sampled id decodes to text):
# chat, streamed text and the probe's text all work, which a bare preset (no tokenizer) cannot give.
# The GPU machine has no FastAPI / uvicorn / pydantic / openai: carry their cp312 wheels in .whl (device README).
#   MODE=background: start the soak detached and return (a 10-minute soak outlasts one 600 s device call;
#   a second call waits for it with MODE=wait).  Results: $OUT (or ./gpu-out).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
work=/tmp/wisp_soak; mkdir -p "$work"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=$work/olmoe_shapes_demo_tokenizer
make_model() {
  python3 - "$model" ${LAYERS:-} <<'EOF'
import json, shutil, sys
from pathlib import Path
from wisp.models.presets import preset
from wisp.models.demo import demo_path

dest, demo = Path(sys.argv[1]), demo_path()
dest.mkdir(parents=True, exist_ok=True)
demo_config = json.loads((demo / "config.json").read_text())
config = preset("olmoe-1b-7b") | {"vocab_size": demo_config["vocab_size"], "eos_token_id": demo_config["eos_token_id"]}
if len(sys.argv) > 2:  # a local check of this script: fewer layers
    config["num_hidden_layers"] = int(sys.argv[2])
(dest / "config.json").write_text(json.dumps(config, indent=1))
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(demo / name, dest / name)
EOF
}
soak() {
  python3 -m wisp bench soak --minutes "${MINUTES:-10}" --model "$model" --load-format dummy --device "${DEVICE:-cuda}" \
    --max-model-len 2048 --max-num-batched-tokens 256 --out "$work/soak_gpu_olmoe.json" >"$work/soak_gpu_olmoe.txt" 2>&1
  echo $? >"$work/rc"
}
case "${MODE:-foreground}" in
background)
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  if [ -n "${TESTS:-}" ]; then  # first the live-resize tests on the GPU (graphs, Triton), if asked
    timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_kv_cache.py tests/engine/test_live_resize.py \
      tests/engine/test_live_split.py tests/engine/test_routing_log.py tests/engine/decode/test_graphs.py --wisp-device cuda \
      --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_live_resize_cuda.txt" | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  fi
  rm -f "$work/rc"; make_model || exit 1
  export -f soak; export model work MINUTES DEVICE
  setsid nohup bash -c soak </dev/null >/dev/null 2>&1 &
  sleep "${SETTLE:-45}"; tail -5 "$work/soak_gpu_olmoe.txt" ;;
wait)
  # until the soak writes its exit status (the device call's own time limit ends a soak that hangs)
  until [ -f "$work/rc" ]; do cp "$work"/soak_gpu_olmoe.* "$out/" 2>/dev/null; sleep 5; done
  cp "$work"/soak_gpu_olmoe.* "$work"/rc "$out/" 2>/dev/null; ls "$out"; tail -15 "$work/soak_gpu_olmoe.txt" ;;
*)
  make_model || exit 1; soak; cp "$work"/soak_gpu_olmoe.* "$work/rc" "$out/"; tail -15 "$work/soak_gpu_olmoe.txt" ;;
esac
