#!/usr/bin/env bash
# Batch-1 decode kernels on the GPU, in one call (docs/decisions/dense-projection-tiles-split-k-for-decode.md).
# Prepare the older tree first (ignored by git, carried with `carry: [".gpu_data"]`):
#   rm -rf .gpu_data/old && mkdir -p .gpu_data/old && git archive <REV> wisp | tar -x -C .gpu_data/old
#   STAGE=check: (KERNEL_TESTS=1, MODEL_TESTS=1: the kernels' and the models' CUDA tests) (the GEMM's both schedules under graph replay, the fused heads, the MoE),
#       resident decode A/B against .gpu_data/old (OLMoE BF16, Qwen3-30B-A3B BF16 and FP8, 48 layers), a profile
#       of 8 layers after, `wisp bench sweep linear`, and the model parity tests with the Triton backend.
#   STAGE=peer: llama.cpp (built here, as gpu_llama_cpp.sh does) on OLMoE-1B-7B BF16 with every expert on the GPU,
#       then wisp resident in the same call: decode (128 tokens after a 512-token prompt) and cold TTFT 512 / 2048.
#       Needs .llama_cpp (carry it).
#   STAGE=ab: resident decode A/B against .gpu_data/old, alternating (OLMoE with and without its real routing, Qwen3).
#   STAGE=moe-tiles: the MoE kernels' CUDA tests, gpt-oss-20b decode on .gpu_data/old and this tree, and
#       `wisp bench sweep moe-attention` on SHAPES (default gpt-oss,qwen3-fp8) against the old tree's MoE module.
#   STAGE=gptoss-ops: GPT-OSS's Triton norms and routing: CUDA tests, gpt-oss-20b decode .gpu_data/old against this
#       tree (twice, alternated), and a profile of a 2048-token prefill.
#   STAGE=arms: ARMS="old mid new" ROUNDS=4: resident decode of MODEL alternating trees under .gpu_data, one JSON.
#   STAGE=after: DeepSeek-V2-Lite's latent attention on the GPU (its tests, resident and paged decode), Qwen3-30B-A3B
#       resident decode (BF16, FP8) and TTFT, and the default tiles' GEMM times (bf16 and FP8 weights).
#   STAGE=fused: the decode launches folded (residual add into the norm, the step count into the MoE sort, k/v into
#       the cache from the fused heads): their CUDA tests and the engine's graph and mode-identity tests, then
#       resident decode alternating .gpu_data/old and this tree (OLMoE ROUNDS times, Qwen3 BF16 and FP8 once), OLMoE
#       with its real routing, DeepSeek-V2-Lite resident and paged, and a profile of OLMoE's 8 layers; one JSON.
#   STAGE=peer2: llama.cpp built here (the engine's CUDA graph and mode-identity tests run meanwhile), llama-bench on
#       OLMoE-1B-7B BF16 all on the GPU, then wisp resident in the same call: decode with the random router (twice)
#       and with OLMoE's real routing, batches 1, 4, 16 (16: past the graphs, eager), and a host profile of the
#       replayed steps. Needs .llama_cpp (carry it).
#   STAGE=gptoss: gpt-oss-20b with MXFP4 experts: llama-bench all on the GPU (built here; the MoE kernels' CUDA tests
#       meanwhile), then wisp resident decode and cold TTFT 512 / 2048 in the same call; the MoE kernels against
#       .gpu_data/old's (if there), and a profile of the decode step. Needs .llama_cpp (carry it).
#   STAGE=samefile: MODEL (default olmoe-1b-7b) TYPE (bf16, q8_0) as one random GGUF file: llama-bench on it (built
#       here) with every expert on the GPU, then wisp on the same file (`--model FILE.gguf`: the same weights, the same
#       random routing), resident decode and cold TTFT 512 / 2048. The A/B of a tree against this one (e.g. the MXFP4
#       rewrite 4d19c91 applied to a copy under .gpu_data): STAGE=arms ARMS="new TREE" MODEL=gpt-oss-20b.
#   STAGE=weights-first: the MoE sweep on SHAPES (default qwen3-fp8,gpt-oss,qwen3,qwen3-q4_k), the launch fields in VARY
#       (default weights_first,rows) varied alone (`Blocks.weights_first`: the dequantized weight tile as the
#       tensor-core product's register operand), then resident decode of MODELS (default gpt-oss-20b qwen3-30b-a3b-fp8) alternating the shipped
#       launch and weights_first on every format, twice each (about 8 minutes, not yet run).
#   STAGE=sampling: the device sampler's CUDA tests, `wisp bench profile sampling` at batches 1, 4, 16, and resident
#       decode of MODEL (default olmoe-1b-7b) greedy and at temperature 0.7, batches 1 and 16, against .gpu_data/old
#       where it is there (about 4 minutes, not yet run).
# Results and logs in $OUT (packed into one archive: the device tool returns few files).
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
wisp="python3 -m wisp"  # this tree; the older one: `old` (a script, so that `timeout` can run it)
printf '#!/bin/sh\ncd %s/.gpu_data/old && PYTHONPATH=$PWD exec python3 -m wisp "$@"\n' "$PWD" > /tmp/old && chmod +x /tmp/old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/gpu.txt"
pack() { tar czf /tmp/decode_kernels.tgz -C "$out" --exclude decode_kernels.tgz . 2>/dev/null && cp /tmp/decode_kernels.tgz "$out/"; }
decode="bench decode --load-format dummy --mode resident --prompt-len 512 --decode-tokens 128"
case "${STAGE:-check}" in
check)
  [ -n "${KERNEL_TESTS:-}" ] && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_triton_linear.py \
    tests/core/kernels/test_triton_qkv_heads.py tests/core/kernels/test_triton_moe.py tests/core/kernels/test_quantized_experts.py tests/core/kernels/test_k_quants.py > "$out/pytest_kernels_cuda.txt" 2>&1
  tail -4 "$out/pytest_kernels_cuda.txt" 2>/dev/null
  for m in ${MODELS:-olmoe-1b-7b qwen3-30b-a3b-fp8 qwen3-30b-a3b}; do
    timeout 150 /tmp/old $decode --model "$m" --out "$out/decode_${m}_before.json" 2>"$out/decode_${m}_before.log" | tail -2
    timeout 150 $wisp $decode --model "$m" --out "$out/decode_${m}_after.json" 2>"$out/decode_${m}_after.log" | tail -2
    pack
  done
  for m in qwen3-30b-a3b-fp8 olmoe-1b-7b; do
    timeout 90 $wisp bench profile steps --model "$m" --layers 8 --mode resident --phase decode --graphs --rows 24 \
      > "$out/profile_${m}_8_layers.txt" 2>&1; head -30 "$out/profile_${m}_8_layers.txt" | grep -v Warn; pack
  done
  timeout 170 $wisp bench sweep linear --rows 1,2048 --out "$out/linear_sweep.json" > "$out/linear_sweep.txt" 2>&1
  grep -A40 "closest" "$out/linear_sweep.txt" | head -12; pack
  [ -n "${MODEL_TESTS:-}" ] && timeout 150 python3 -m pytest -q -p no:cacheprovider tests/models/test_hf_parity.py \
    tests/models/test_fp8_checkpoint.py tests/models/test_qkv_fusion.py --wisp-device cuda --wisp-moe-backend triton \
    > "$out/pytest_models_cuda.txt" 2>&1; tail -4 "$out/pytest_models_cuda.txt" 2>/dev/null ;;
peer)
  python3 -m pip install -q --no-index --no-deps .llama_cpp/wheels/*.whl 2>&1 | tail -1
  STAGE=peer MODEL=olmoe-1b-7b TYPE=bf16 PLACEMENTS=all-gpu PEER_TIMEOUT=150 OUT="$out/peer" \
    bash benchmarks/recipes/gpu_llama_cpp.sh 2>&1 | tail -8
  pack
  timeout 120 $wisp $decode --model olmoe-1b-7b --routing-trace .gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl \
    --out "$out/decode_olmoe-1b-7b_resident.json" 2>"$out/decode_olmoe-1b-7b_resident.log" | tail -2
  timeout 120 $wisp bench prefill --load-format dummy --model olmoe-1b-7b --mode resident --prompt-len 512,2048 \
    --out "$out/prefill_olmoe-1b-7b_resident.json" 2>"$out/prefill_olmoe-1b-7b_resident.log" | tail -3
  pack ;;
after)
  timeout 130 python3 -m pytest -q -p no:cacheprovider tests/engine/test_triton_mla_attention.py \
    "tests/engine/decode/test_graphs.py::test_latent_attention_decodes_from_graphs_with_the_eager_bits" \
    > "$out/pytest_mla_attention_cuda.txt" 2>&1; tail -2 "$out/pytest_mla_attention_cuda.txt"
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/models/test_hf_parity.py -k deepseek --wisp-device cuda \
    --wisp-moe-backend triton --wisp-attention-backend triton > "$out/pytest_deepseek_cuda.txt" 2>&1
  tail -2 "$out/pytest_deepseek_cuda.txt"
  timeout 120 $wisp bench decode --load-format dummy --model deepseek-v2-lite --prompt-len 128 --decode-tokens 64 \
    --mode resident,paged --expert-cap 16,32 --out "$out/decode_deepseek_v2_lite.json" 2>"$out/decode_deepseek.log" | tail -4
  pack
  for m in qwen3-30b-a3b-fp8 qwen3-30b-a3b; do
    timeout 100 $wisp $decode --model "$m" --out "$out/decode_${m}_after.json" 2>"$out/decode_${m}_after.log" | tail -2
    timeout 100 $wisp bench prefill --load-format dummy --model "$m" --mode resident --prompt-len 512,2048 \
      --out "$out/prefill_${m}_resident.json" 2>"$out/prefill_${m}_resident.log" | tail -3
    pack
  done
  timeout 60 $wisp bench sweep linear --rows 1,2048 --no-sweep --out "$out/linear_default_tiles.json" \
    > "$out/linear_default_tiles.txt" 2>&1; grep -v "^$" "$out/linear_default_tiles.txt" | tail -30 ;;
ab)  # resident decode, .gpu_data/old against this tree, alternating twice; OLMoE with and without its real routing
  trace=.gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl
  for round in 1 2; do
    for arm in old new; do
      run=$wisp; [ $arm = old ] && run=/tmp/old
      timeout 60 $run $decode --model olmoe-1b-7b --out "$out/ab_olmoe_${arm}_r$round.json" 2>/dev/null | tail -1
      timeout 60 $run $decode --model olmoe-1b-7b --routing-trace $trace --out "$out/ab_olmoe_trace_${arm}_r$round.json" \
        2>/dev/null | tail -1
    done
  done
  for arm in old new; do
    run=$wisp; [ $arm = old ] && run=/tmp/old
    timeout 90 $run $decode --model qwen3-30b-a3b --out "$out/ab_qwen3_${arm}.json" 2>/dev/null | tail -1
  done ;;
fused)
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_triton_interpreted.py \
    tests/core/kernels/test_triton_qkv_heads.py tests/core/kernels/test_triton_moe.py tests/engine/decode/test_graphs.py \
    > "$out/pytest_fused_cuda.txt" 2>&1; tail -3 "$out/pytest_fused_cuda.txt"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/engine/test_mode_identity.py tests/models/test_hf_parity.py \
    --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton > "$out/pytest_models_cuda.txt" 2>&1
  tail -3 "$out/pytest_models_cuda.txt"; pack
  mkdir -p /tmp/arms
  one() {  # tree model name [flags]: one decode record into /tmp/arms/<tree>_<name>.json
    local tree=$1 model=$2 name=$3; shift 3; local dir=$PWD; [ "$tree" != new ] && dir=$PWD/.gpu_data/$tree
    (cd "$dir" && PYTHONPATH=$dir timeout 90 python3 -m wisp $decode --model "$model" "$@" \
      --out "/tmp/arms/${tree}_$name.json" 2>>"$out/decode.log" | tail -1)
  }
  for round in $(seq "${ROUNDS:-3}"); do for tree in old new; do one $tree olmoe-1b-7b "olmoe_r$round"; done; done
  one new olmoe-1b-7b olmoe_trace --routing-trace "$PWD/.gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl"
  for tree in old new; do one $tree olmoe-1b-7b olmoe_batches --batch 4,16; done
  for m in qwen3-30b-a3b qwen3-30b-a3b-fp8; do for tree in old new; do one $tree $m "$m"; done; done
  timeout 150 $wisp bench decode --load-format dummy --model deepseek-v2-lite --prompt-len 128 --decode-tokens 64 \
    --mode resident,resident,paged --expert-cap 16,32 --out /tmp/arms/new_deepseek.json 2>>"$out/decode.log" | tail -4
  python3 - "$out/decode_fused.json" <<'PY'
import json, glob, sys, os
recs = []
for f in sorted(glob.glob("/tmp/arms/*.json")):
    tree, name = os.path.basename(f)[:-5].split("_", 1)
    for r in json.load(open(f)):
        r.update(tree=tree, run=name); recs.append(r)
json.dump(recs, open(sys.argv[1], "w"), indent=1)
for r in recs:
    print(r["tree"], r["run"], r.get("mode"), r.get("expert_cap"), "decode tok/s", r["decode_tok_s"], "ttft", r.get("ttft_s"))
PY
  pack
  timeout 60 $wisp bench profile steps --model olmoe-1b-7b --layers 8 --mode resident --phase decode --graphs --rows 30 \
    > "$out/profile_olmoe_8_layers.txt" 2>&1; grep -v Warn "$out/profile_olmoe_8_layers.txt" | head -34 ;;
peer2)
  python3 -m pip install -q --no-index --no-deps .llama_cpp/wheels/*.whl 2>&1 | tail -1
  (STAGE=peer MODEL=olmoe-1b-7b TYPE=bf16 PLACEMENTS=all-gpu PEER_TIMEOUT=150 OUT="$out/peer" \
    bash benchmarks/recipes/gpu_llama_cpp.sh > "$out/peer.log" 2>&1) &
  peer=$!
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/decode/test_graphs.py \
    tests/engine/test_mode_identity.py --wisp-device cuda --wisp-moe-backend triton --wisp-attention-backend triton \
    > "$out/pytest_engine_cuda.txt" 2>&1; tail -2 "$out/pytest_engine_cuda.txt"
  wait $peer; tail -8 "$out/peer.log"; pack
  trace=$PWD/.gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl
  for r in 1 2; do
    timeout 60 $wisp $decode --model olmoe-1b-7b --out "$out/decode_olmoe_router_r$r.json" 2>>"$out/decode.log" | tail -1
    timeout 60 $wisp $decode --model olmoe-1b-7b --routing-trace "$trace" --out "$out/decode_olmoe_trace_r$r.json" \
      2>>"$out/decode.log" | tail -1
  done
  timeout 90 $wisp $decode --model olmoe-1b-7b --batch 4,16 --out "$out/decode_olmoe_batches.json" 2>>"$out/decode.log" | tail -2
  timeout 120 $wisp bench prefill --load-format dummy --model olmoe-1b-7b --mode resident --prompt-len 512,2048 \
    --out "$out/prefill_olmoe.json" 2>>"$out/decode.log" | tail -3
  pack
  timeout 60 $wisp bench profile steps --model olmoe-1b-7b --mode resident --phase decode --graphs --host --rows 25 \
    --routing-trace "$trace" --prompt-len 512 --steps 100 > "$out/host_profile_trace.txt" 2>&1; head -30 "$out/host_profile_trace.txt" ;;
gptoss)
  python3 -m pip install -q --no-index --no-deps .llama_cpp/wheels/*.whl 2>&1 | tail -1
  (STAGE=peer MODEL=gpt-oss-20b TYPE=bf16 PLACEMENTS=all-gpu PEER_TIMEOUT=200 OUT="$out/peer_gpt_oss" \
    bash benchmarks/recipes/gpu_llama_cpp.sh > "$out/peer_gpt_oss.log" 2>&1) &
  peer=$!
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_quantized_experts.py \
    tests/core/kernels/test_mxfp4.py tests/core/kernels/test_triton_moe.py > "$out/pytest_quantized_cuda.txt" 2>&1
  tail -2 "$out/pytest_quantized_cuda.txt"
  wait $peer; tail -3 "$out/peer_gpt_oss.log"; pack
  timeout 120 $wisp $decode --model gpt-oss-20b --out "$out/decode_gpt_oss_20b.json" 2>"$out/decode_gpt_oss.log" | tail -2
  timeout 120 $wisp bench prefill --load-format dummy --model gpt-oss-20b --mode resident --prompt-len 512,2048 \
    --out "$out/prefill_gpt_oss_20b.json" 2>>"$out/decode_gpt_oss.log" | tail -3
  pack
  [ -d .gpu_data/old ] && timeout 100 $wisp bench sweep moe-attention --shapes gpt-oss,qwen3-fp8,olmoe --no-sweep \
    --no-attention --compare-with .gpu_data/old/wisp/core/kernels/triton_moe.py --out "$out/moe_kernels.json" \
    > "$out/moe_kernels.txt" 2>&1; grep -v Warn "$out/moe_kernels.txt" | tail -16; pack
  timeout 90 $wisp bench profile steps --model gpt-oss-20b --mode resident --phase decode --graphs --rows 30 --steps 5 \
    > "$out/profile_gpt_oss_20b.txt" 2>&1; grep -v Warn "$out/profile_gpt_oss_20b.txt" | head -34 ;;
samefile)
  python3 -m pip install -q --no-index --no-deps .llama_cpp/wheels/*.whl 2>&1 | tail -1
  model=${MODEL:-olmoe-1b-7b}; type=${TYPE:-bf16}; gguf=/tmp/$model-$type.gguf
  KEEP_GGUF=1 STAGE=peer MODEL=$model TYPE=$type PLACEMENTS=all-gpu PEER_TIMEOUT=200 OUT="$out/peer" \
    bash benchmarks/recipes/gpu_llama_cpp.sh 2>&1 | tail -4
  pack
  timeout 150 $wisp bench decode --model "$gguf" --mode resident --prompt-len 512 --decode-tokens 128 \
    --out "$out/decode_${model}_${type}_gguf.json" 2>"$out/decode_gguf.log" | tail -2
  timeout 150 $wisp bench prefill --model "$gguf" --mode resident --prompt-len 512,2048 \
    --out "$out/prefill_${model}_${type}_gguf.json" 2>>"$out/decode_gguf.log" | tail -3
  rm -f "$gguf" ;;
moe-tiles)  # the MoE kernels' CUDA tests; gpt-oss-20b resident decode, .gpu_data/old's tree then this one; the
  # MoE launch sweep (SHAPES, default gpt-oss MXFP4 and Qwen3 FP8) against .gpu_data/old's triton_moe.py
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_quantized_experts.py \
    tests/core/kernels/test_mxfp4.py tests/core/kernels/test_triton_moe.py > "$out/pytest_moe_cuda.txt" 2>&1
  tail -2 "$out/pytest_moe_cuda.txt"
  for arm in old new; do
    run=$wisp; [ $arm = old ] && run=/tmp/old
    timeout 100 $run $decode --model gpt-oss-20b --out "$out/decode_gpt_oss_20b_$arm.json" 2>>"$out/decode.log" | tail -1
  done
  pack
  timeout "${SWEEP_S:-300}" $wisp bench sweep moe-attention --shapes "${SHAPES:-gpt-oss,qwen3-fp8}" --no-attention \
    --compare-with .gpu_data/old/wisp/core/kernels/triton_moe.py --out "$out/moe_sweep.json" > "$out/moe_sweep.txt" 2>&1
  grep -v "^\s*$" "$out/moe_sweep.txt" | grep -v "Warn" | head -80 ;;
gptoss-ops)  # GPT-OSS's norms (float32 weights) and routing in Triton: their CUDA tests and gpt-oss's parity with
  # transformers on the GPU, gpt-oss-20b resident decode on .gpu_data/old and this tree, and a profile of a prefill
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/core/kernels/test_triton_interpreted.py \
    tests/models/test_hf_parity.py -k "gpt or norm or router or route" --wisp-device cuda --wisp-moe-backend triton \
    --wisp-attention-backend triton > "$out/pytest_gpt_oss_cuda.txt" 2>&1; tail -2 "$out/pytest_gpt_oss_cuda.txt"
  for round in 1 2; do for arm in old new; do
    run=$wisp; [ $arm = old ] && run=/tmp/old
    timeout 90 $run $decode --model gpt-oss-20b --out "$out/decode_gpt_oss_20b_${arm}_r$round.json" 2>>"$out/decode.log" | tail -1
  done; done
  pack
  timeout 120 $wisp bench profile steps --model gpt-oss-20b --mode resident --phase prefill --prompt-len 2048 --rows 25 \
    > "$out/profile_prefill_gpt_oss_20b.txt" 2>&1; grep -v Warn "$out/profile_prefill_gpt_oss_20b.txt" | cut -c1-60,150- | head -32 ;;
arms)  # resident OLMoE decode, alternating the trees in ARMS (folders under .gpu_data holding a wisp/, or "new"),
  # ROUNDS times; one JSON of every record (the device tool returns few files)
  mkdir -p /tmp/arms
  for round in $(seq "${ROUNDS:-4}"); do
    for arm in ${ARMS:-old new}; do
      dir=$PWD; [ "$arm" != new ] && dir=$PWD/.gpu_data/$arm
      (cd "$dir" && PYTHONPATH=$dir timeout 60 python3 -m wisp $decode --model "${MODEL:-olmoe-1b-7b}" \
        --out "/tmp/arms/${arm}_r$round.json" 2>/dev/null | tail -1)
    done
  done
  python3 - "$out/arms.json" <<'PY'
import json, glob, sys, os
recs = []
for f in sorted(glob.glob("/tmp/arms/*.json")):
    arm, rnd = os.path.basename(f)[:-5].rsplit("_r", 1)
    for r in json.load(open(f)):
        r.update(tree=arm, repeat=int(rnd)); recs.append(r)  # not "arm": the report reads that as an agent record
json.dump(recs, open(sys.argv[1], "w"), indent=1)
for arm in sorted({r["tree"] for r in recs}):
    v = sorted(r["decode_tok_s"] for r in recs if r["tree"] == arm)
    print(arm, "tok/s", v, "median", v[len(v) // 2])
PY
  rm -f "$out"/decode_kernels.tgz; exit 0 ;;
weights-first)  # the MoE kernels with the weight tile as the product's register operand (`Blocks.weights_first`):
  # the MoE sweep (each launch field varied alone, weights_first among them) on SHAPES, then resident decode of each
  # model in MODELS alternating the shipped launch and weights_first on every format (patched in-process), twice
  timeout 260 python3 -m wisp bench sweep moe-attention --shapes "${SHAPES:-qwen3-fp8,gpt-oss,qwen3,qwen3-q4_k}" \
    --vary "${VARY:-weights_first,rows}" --no-attention --out "$out/moe_sweep_weights_first.json" > "$out/moe_sweep_weights_first.txt" 2>&1
  grep -E "T=1 |T=2048 " "$out/moe_sweep_weights_first.txt" | grep -E "device$|weights_first|device  " | head -40
  cat > /tmp/weights_first.py <<'PY'
import sys
from dataclasses import replace
import wisp.core.kernels.triton_moe as moe
moe.TILES = {k: tuple(replace(b, weights_first=True) for b in v) for k, v in moe.TILES.items()}
from wisp.cli import main
sys.argv = ["wisp"] + sys.argv[1:]
raise SystemExit(main())
PY
  for m in ${MODELS:-gpt-oss-20b qwen3-30b-a3b-fp8}; do for round in 1 2; do
    timeout 100 $wisp $decode --model "$m" --out "$out/decode_${m}_shipped_r$round.json" 2>/dev/null | tail -1
    timeout 100 python3 /tmp/weights_first.py $decode --model "$m" --out "$out/decode_${m}_weights_first_r$round.json" \
      2>/dev/null | tail -1
  done; done ;;
sampling)  # the step's sampling drawn on the device (wisp.engine.batch_sampler): its CUDA tests, its cost alone at
  # Qwen3's vocabulary, then resident decode of MODEL (default olmoe-1b-7b) greedy and at temperature 0.7, batches 1
  # and 16 (.gpu_data/old too where it is there: the per-row host sampler before)
  timeout 120 python3 -m pytest -q -p no:cacheprovider --wisp-device cuda tests/engine/test_batch_sampler.py \
    tests/engine/test_sampling.py tests/engine/test_failure_isolation.py > "$out/pytest_sampling_cuda.txt" 2>&1
  tail -2 "$out/pytest_sampling_cuda.txt"
  timeout 120 $wisp bench profile sampling --batch 1,4,16 --out "$out/sampling_h200.json" 2>&1 | tail -12
  for b in 1 16; do for t in 0 0.7; do
    [ -d .gpu_data/old ] && timeout 100 /tmp/old $decode --model "${MODEL:-olmoe-1b-7b}" --batch $b --temperature $t \
      --out "$out/decode_sampling_old_b${b}_t$t.json" 2>/dev/null | tail -1
    timeout 100 $wisp $decode --model "${MODEL:-olmoe-1b-7b}" --batch $b --temperature $t \
      --out "$out/decode_sampling_b${b}_t$t.json" 2>/dev/null | tail -1
  done; done ;;
esac
pack
