#!/usr/bin/env bash
# GPU-machine calls for load control (`wisp bench serve`), one H200; STAGE picks one call's work, results in $OUT.
#   qwen3:   Qwen3-30B-A3B preset, random router: C = 16 at W = 1, 4 (on, off; fixed widths 1 and 2 as run-to-completion,
#            --max-concurrency b, and as turns under the same wait bound, --load-control width:b) and C = 32 at W = 8
#   mixtral: Mixtral-8x7B preset, the 4 real decode sequences replayed one per request, W = 4, at CAPS (default 4 6):
#            on, off and fixed widths 1 and 2 under the same bound (an arm takes 80-115 s at C = 4)
#   wide:    wide decode steps (4 and 8 requests decoding together at C = 16, load control off) as CUDA graphs,
#            decided on the device, against the eager host-decided step (--enforce-eager), after the GPU tests
#            of the device path (about 6 of the 10 minutes)
#   agent:   `wisp bench agent`, OLMoE preset, 8 GiB, W = 4, real layer-0 routing, os and db sessions, on and off
#   phases:  `wisp bench agent` with the concurrency in phases (1 session at a time, then 8 at once, then 2; os and db
#            sessions, repeats made distinct), mv-wsa against the controller (KV floor following the requests in
#            flight), ABBA, each arm in a fresh process, load control on (about 8 of the 9 minutes)
#   phases_static: the same workload, the other static splits (kv-blind, 50-50), to name the best static one
#   stationary: os (W = 4) then db (W = 4), mv-wsa against the controller, ABBA, fresh processes, load control on
# .gpu_data/ (ignored by git; pass it with the device tool's carry) holds copies from ../shared/data: the Mixtral
# files routing_mixtral8x7b/{gsm8k,humaneval}_2_decode_TxLxK.npz, the OLMoE trace and the AgentInstruct samples.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
d=.gpu_data
serve() { name=$1; shift; timeout ${LIMIT:-240} python3 -m wisp bench serve --load-format dummy --prompt-len 128 --output-len 128 \
  --out "$out/$name.json" "$@" 2>"$out/$name.log" | tee "$out/$name.txt"; }
# agent NAME SECONDS ARGS...: one `wisp bench agent` call on the OLMoE preset, cut at SECONDS (records are written
# after every arm, so a cut run keeps the arms it finished)
agent() { name=$1 limit=$2; shift 2; timeout "$limit" python3 -m wisp bench agent --model olmoe-1b-7b --load-format dummy \
  --vram-budget 8GiB --max-model-len 4096 --routing-trace $d/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl --load-control on \
  --out "$out/$name.json" "$@" 2>"$out/$name.log" | tee "$out/$name.txt"; }
sessions="$d/agentinstruct_os_sample5.json $d/agentinstruct_db_sample5.json"
case "${STAGE:-qwen3}" in
qwen3)
  q="--model qwen3-30b-a3b --mode paged"
  serve c16 $q --expert-cap 16 --concurrency 1,2,4 --num-requests 4 --load-control on,off --plot "$out/c16.png"
  serve c16_fixed1 $q --expert-cap 16 --concurrency 4 --num-requests 4 --load-control off --max-concurrency 1
  serve c16_fixed2 $q --expert-cap 16 --concurrency 4 --num-requests 4 --load-control off --max-concurrency 2
  serve c16_width $q --expert-cap 16 --concurrency 4 --num-requests 4 --load-control width:1,width:2
  serve c32 $q --expert-cap 32 --concurrency 8 --num-requests 8 --load-control on,off ;;
mixtral)
  python3 -c "
from wisp.trace.format import RoutingTrace
from wisp.trace.readers import load_any
parts = [load_any('$d/gsm8k_2_decode_TxLxK.npz'), load_any('$d/humaneval_2_decode_TxLxK.npz')]
RoutingTrace.concat(parts).save('$d/mixtral_4_sequences.npz')"
  for cap in ${CAPS:-4 6}; do
    LIMIT=520 serve mixtral_c$cap --model mixtral-8x7b --mode paged --expert-cap $cap --concurrency 4 --num-requests 4 \
      --routing-trace $d/mixtral_4_sequences.npz --load-control on,off,width:1,width:2
  done ;;
wide)
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/experts/test_expert_major_on_device.py \
    tests/core/experts/test_device_pager.py tests/engine/decode/test_graphs.py > "$out/wide_tests.txt" 2>&1
  tail -3 "$out/wide_tests.txt"
  w="--load-format dummy --prompt-len 128 --model qwen3-30b-a3b --expert-cap 16 --decode-tokens 16 --load-control off"
  timeout 240 python3 -m wisp bench decode $w --mode resident,paged --batch 4,8 --out "$out/wide_graphs.json" \
    2>"$out/wide_graphs.log" | tee "$out/wide_graphs.txt"
  timeout 100 python3 -m wisp bench decode $w --mode paged --batch 4 --enforce-eager --out "$out/wide_eager.json" 2>"$out/wide_eager.log" | tee "$out/wide_eager.txt" ;;
agent)
  for lc in on off; do
    timeout 280 python3 -m wisp bench agent --model olmoe-1b-7b --load-format dummy --vram-budget 8GiB --concurrency 4 \
      --max-model-len 4096 --routing-trace $d/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl --arms mv-wsa --load-control $lc \
      --sessions $d/agentinstruct_os_sample5.json $d/agentinstruct_db_sample5.json --out "$out/agent_$lc.json" \
      2>"$out/agent_$lc.log" | tee "$out/agent_$lc.txt"
  done ;;
phases)
  agent phases 530 --sessions $sessions --phases 1:2,8:8,2:4 --arms mv-wsa,controller --order abba ;;
phases_static)
  agent phases_static 400 --sessions $sessions --phases 1:2,8:8,2:4 --arms kv-blind,50-50 ;;
stationary)
  agent stationary_os 320 --sessions $d/agentinstruct_os_sample5.json --concurrency 4 --arms mv-wsa,controller --order abba
  agent stationary_db 200 --sessions $d/agentinstruct_db_sample5.json --concurrency 4 --arms mv-wsa,controller --order abba ;;
*) echo "unknown STAGE ${STAGE}; choose qwen3, mixtral, wide, agent, phases, phases_static or stationary" >&2; exit 2 ;;
esac
