#!/usr/bin/env bash
# GPU-machine calls for agent sessions (`wisp bench agent`), one H200. STAGE=table4|drift|qwen3 picks one call's work;
# results land in $OUT (or ./gpu-out). The OLMoE layer-0 routing trace and the AgentInstruct samples travel in
# .gpu_data/ (ignored by git; pass it with the device tool's carry): copied from ../shared/data.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
d=.gpu_data
olmoe() { name=$1; shift; python3 -m wisp bench agent --model olmoe-1b-7b --load-format dummy --vram-budget 8GiB \
  --concurrency 4 --max-model-len 4096 --routing-trace $d/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl \
  --out "$out/$name.json" --plot "$out/$name.png" "$@" 2>"$out/$name.log" | tee "$out/$name.txt"; }
case "${STAGE:-table4}" in
table4)  # live resizes and the controller on the GPU (graphs, Triton), then the paper's Table 4 setting, every arm
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_live_resize.py tests/engine/test_live_split.py \
    tests/engine/decode/test_graphs.py --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton \
    2>&1 | tee "$out/pytest_live_split_cuda.txt" | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  olmoe agent_olmoe_1b_7b_os --sessions $d/agentinstruct_os_sample5.json ;;
drift)  # os -> db -> webshop back to back: the static arms against the online controller
  olmoe agent_olmoe_1b_7b_drift --sessions $d/agentinstruct_{os,db,webshop}_sample5.json \
    --arms ${ARMS:-mv-wsa,50-50,kv-blind,controller} ;;
drift_qwen3)  # both below in one call, each cut at under five minutes (records are written after every arm)
  STAGE=drift ARMS=mv-wsa,50-50,controller timeout 290 bash "$0"
  STAGE=qwen3 ARMS=mv-wsa,controller timeout 290 bash "$0" ;;
recover)  # the controller started at the 50-50 split, live: OLMoE (as table4) and Qwen3-30B-A3B at 24 GiB with
  # i.i.d. uniform routing replayed (a no-locality bound), after the capture-stream change's GPU tests
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_live_resize.py tests/engine/test_live_split.py \
    tests/engine/decode/test_graphs.py --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton \
    2>&1 | tee "$out/pytest_live_split_cuda_one_stream.txt" | tail -2
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  timeout 150 bash -c "$(declare -f olmoe); d=$d out=$out; olmoe agent_olmoe_1b_7b_os_controller_from_50_50 \
    --sessions $d/agentinstruct_os_sample5.json --arms controller --controller-start 50-50"
  timeout 330 python3 -m wisp bench agent --model qwen3-30b-a3b --load-format dummy --vram-budget 24GiB --concurrency 4 \
    --max-model-len 4096 --sessions $d/agentinstruct_os_sample5.json --routing-trace uniform --arms mv-wsa,controller \
    --controller-start 50-50 --out "$out/agent_qwen3_30b_a3b_os_uniform.json" \
    --plot "$out/agent_qwen3_30b_a3b_os_uniform.png" 2>"$out/agent_qwen3_30b_a3b_os_uniform.log" \
    | tee "$out/agent_qwen3_30b_a3b_os_uniform.txt" ;;
log)  # the device-side routing log under CUDA graphs (the live split's feed without a replay)
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/engine/test_routing_log.py tests/engine/test_live_split.py \
    --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton 2>&1 | tee "$out/pytest_routing_log_cuda.txt" | tail -3 ;;
qwen3)  # Qwen3-30B-A3B at 24 GiB, random router (no real 128-expert trace exists here): plan vs controller
  python3 -m wisp bench agent --model qwen3-30b-a3b --load-format dummy --vram-budget 24GiB --concurrency 4 \
    --max-model-len 4096 --sessions $d/agentinstruct_os_sample5.json --arms ${ARMS:-mv-wsa,50-50,controller} \
    --out "$out/agent_qwen3_30b_a3b_os.json" --plot "$out/agent_qwen3_30b_a3b_os.png" \
    2>"$out/agent_qwen3_30b_a3b_os.log" | tee "$out/agent_qwen3_30b_a3b_os.txt" ;;
esac
