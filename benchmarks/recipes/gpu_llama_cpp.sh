#!/usr/bin/env bash
# The llama.cpp peer: llama.cpp with experts on the CPU, in our harness, on the GPU machine. Needs .llama_cpp/ from
# `bash benchmarks/recipes/llama_cpp/fetch.sh` on the CPU machine; carry .llama_cpp/src, .llama_cpp/COMMIT,
# .llama_cpp/wheels and .gpu_data (not a local build-cpu folder). Results in $OUT.
#   peer: build llama-bench for sm_90 (skipped when a warm machine still has it) while the GGUF (MODEL, TYPE)
#         is written to local disk, then llama-bench at the three placements (`wisp bench llama-cpp run`),
#         then delete the GGUF (KEEP_GGUF=1 keeps it, for wisp to read the same file). GGUF_DIR (default /tmp): where
#         it is written (gpt-oss-120b's is about 65 GB; the writer refuses a folder without room for it). With the build: 5.5 minutes for OLMoE BF16, 8.5 for Qwen3-30B Q8_0 (measured).
#   wisp: our modes on the preset WISP_MODEL (default MODEL) at each llama.cpp placement's footprint: RUNS is
#         "placement:nvidia-smi bytes:mode,mode ..." (the bytes from the peer stage's records; a mode may be
#         written mode@cap, e.g. hybrid@0 for hybrid with no slots, +hotH for H hot experts a layer on the GPU
#         (hybrid@0+hot33), and +eager to run without CUDA graphs), each mode in
#         its own process under the same memory sampler, its cap sized for the bytes less the CUDA
#         context a bare torch process holds; decode with ROUTING replayed (default: OLMoE's real layer-0
#         trace; `uniform` for models no trace of ours fits), and cold TTFT at 512 / 2048 tokens in the
#         placement's first mode, for each prefill chunk in PREFILL_CHUNKS (default 2048; "2048 512" to add
#         llama.cpp's micro-batch, which needs less VRAM).
#   paired: hybrid with no slots (our best mode at llama.cpp's all-CPU footprint: decode, then cold TTFT at 512 and
#         2048 tokens in CHUNK-token prefill steps, default 512 as llama.cpp's micro-batch), then the peer stage at
#         that placement alone, then hybrid again: both sides on the same host minutes apart (the host's memory
#         bandwidth varies between machines and processes). About 7.5 minutes with the build. llama.cpp's decode is
#         also timed without the memory sampler (UNSAMPLED). The comparison is printed at the end
#         (`wisp bench llama-cpp pair`; with --append it joins the paired results file), and every
#         record and log is packed into $OUT/paired_stage.tgz (unpack it, then run `wisp bench llama-cpp pair` on it). The
#         sampler's cost to wisp's decode, in one process:
#         python3 -m wisp bench llama-cpp sampler-cost --routing-trace <trace> --out "$OUT/sampler_cost.json" (about 1 min).
#   footprints: hybrid with hot experts sized by --vram-budget at llama.cpp's half footprint (HALF: bytes for our
#         budget, llama.cpp's nvidia-smi peak less the bare context) and with none at its all-CPU one under uniform
#         routing; llama-bench at all-cpu,half on the GGUF a peer stage kept (KEEP_GGUF=1) on this machine, when it
#         is still here; the half's cold TTFT at 512 / 2048 with HOT hot experts a layer (what the budget sized: 62
#         for Qwen3-30B-A3B FP8 at 17.16 GB); both placements again under the random router's routing; OLD=DIR last
#         runs the half under uniform routing on the tree in DIR. One call: about 8 minutes for Qwen3-30B-A3B.
#   pair_big: llama.cpp and wisp on a big model (gpt-oss-120b: MODEL=gpt-oss-120b) in one call. The GGUF (MODEL, TYPE;
#         gpt-oss's experts MXFP4 whatever TYPE says) is written to GGUF_DIR (default /dev/shm: the disk has ~34 GB
#         free, gpt-oss-120b's file is 65 GB) while llama-bench builds (skipped when built: the peer stage's code),
#         llama-bench runs at PLACEMENTS (default all-cpu,half) on prompts 512 and 2048 and a 64-token decode, REPS
#         repetitions (default 1), -t 16 (plus LLAMA_EXTRA's flags), and the GGUF is deleted (its RAM goes to wisp's
#         pinned experts). Then wisp, dummy weights of WISP_MODEL (default MODEL), hybrid-zero-copy: decode 64 tokens
#         after 512 at each placement (all-cpu: --hot-experts 0; half: --vram-budget HALF, bytes, required with half:
#         llama.cpp's half nvidia-smi peak less the bare CUDA context; auto: that, from this call's records) under ROUTING (default uniform; router: the
#         model's random router; else a trace file), then cold TTFT at 512 / 2048 with HOT hot experts a layer
#         (default 0). Each step's timeout is cut to what is left of BUDGET_S (default 575 s from the script's
#         start; wisp runs WISP_TIMEOUT, default 200, llama-bench PEER_TIMEOUT, default 240), and a step with too
#         little left is skipped (noted): the prefill first, then the half decode. $OUT: the records (llama_cpp_*,
#         decode_*_{all_cpu,half}_hybrid_<routing>, prefill_*_hybrid_hot<HOT>), pair_big_summary.txt (step times
#         and the figures side by side) and pair_big_logs.tgz (every log). Duration for gpt-oss-120b, an estimate
#         (not measured): GGUF 1-2.5 min (tmpfs writes at 0.75-2.5 GB/s on a 2-core test host), llama-bench 2-3 min
#         (two loads of 65 GB), wisp 3 x 1.5 min (gpt-oss-120b's dummy load took 42-56 s in decode_gpt_oss_120b):
#         about 7-9.5 min with llama-bench already built; a fresh machine's 3.5-minute build leaves too little
#         for the prefill (run the stage again on the warm machine). Memory: llama.cpp repacks the CPU's MXFP4
#         experts (AVX2) into its own buffers, at all-cpu about 61 GB beside the 65 GB file (of 128 GiB);
#         LLAMA_EXTRA='--repack 0' reads them from the file instead (not llama.cpp's default).
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# gguf (the GGUF writer), nvidia-ml-py (`wisp bench llama-cpp peak`'s NVML sampler); numpy, pyyaml, tqdm: in the image
python3 -m pip install -q --no-index --no-deps .llama_cpp/wheels/*.whl 2>&1 | tail -1
model=${MODEL:-olmoe-1b-7b}; type=${TYPE:-bf16}
source benchmarks/recipes/llama_cpp/common.sh  # bench, gguf_and_build, llama_bench
case "${STAGE:-peer}" in
peer)
  gguf=${GGUF_DIR:-/tmp}/$model-$type.gguf  # GGUF_DIR: where the file fits
  gguf_and_build "$gguf"
  llama_bench "${PEER_TIMEOUT:-300}" "${PLACEMENTS:-all-cpu,half,all-gpu}" 2 "$gguf" "$out/llama_cpp_${model}_${type}.json"
  [ -n "${KEEP_GGUF:-}" ] || rm -f "$gguf" ;;  # KEEP_GGUF=1: left for wisp to read the same file
paired)
  peak="-m wisp bench llama-cpp peak"
  for run in before peer after; do
    if [ $run = peer ]; then UNSAMPLED=1 PLACEMENTS=all-cpu PEER_TIMEOUT=${PEER_TIMEOUT:-200} STAGE=peer bash "$0" 2>&1 | tail -3; continue; fi
    python3 $peak --out "$out/smi_decode_hybrid_c0_$run.json" -- python3 -m wisp bench decode --load-format dummy \
      --model "$model" --mode hybrid --expert-cap 0 --prompt-len 512 --decode-tokens "${TOKENS:-128}" \
      --routing-trace "${ROUTING:-.gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl}" \
      --out "$out/decode_hybrid_c0_$run.json" 2>"$out/decode_hybrid_c0_$run.log" | tail -2
    python3 $peak --out "$out/smi_prefill_hybrid_c0_$run.json" -- python3 -m wisp bench prefill --load-format dummy \
      --model "$model" --mode hybrid --expert-cap 0 --prompt-len 512,2048 --max-num-batched-tokens "${CHUNK:-512}" \
      --out "$out/prefill_hybrid_c0_$run.json" 2>"$out/prefill_hybrid_c0_$run.log" | tail -3
  done
  python3 -m wisp bench llama-cpp pair --out-dir "$out" | tee "$out/paired_summary.txt"  # --append ... keeps it
  # the device tool returns at most 8 files: the stage's records and logs travel as one archive
  # (written beside $out, then moved in: tar reading the folder it writes into warns and exits 1)
  tar czf "$out.paired_stage.tgz" -C "$out" --exclude paired_summary.txt . \
    && (cd "$out" && find . -mindepth 1 ! -name paired_summary.txt -delete) && mv "$out.paired_stage.tgz" "$out/paired_stage.tgz" ;;
footprints)
  wmodel=${WISP_MODEL:?WISP_MODEL: our preset}; gguf=${GGUF_DIR:-/tmp}/$model-$type.gguf
  lscpu | grep -E "Model name|^CPU\(s\)" > "$out/host.txt"
  decode="python3 -m wisp bench decode --load-format dummy --model $wmodel --prompt-len 512 --decode-tokens 64 --mode hybrid-zero-copy"
  ours() {  # routing (uniform, router): half, then all-CPU
    local trace=(); [ "$1" = uniform ] && trace=(--routing-trace uniform)
    timeout 180 $decode --vram-budget "${HALF:?HALF: bytes}" "${trace[@]}" --out "$out/decode_${wmodel}_half_hybrid_$1.json" \
      2>"$out/decode_half_$1.log" | tail -1
    timeout 150 $decode --hot-experts 0 "${trace[@]}" --out "$out/decode_${wmodel}_all_cpu_hybrid_$1.json" \
      2>"$out/decode_all_cpu_$1.log" | tail -1
  }
  ours uniform
  if [ -x "$bench" ] && [ -f "$gguf" ]; then
    llama_bench "${PEER_TIMEOUT:-240}" all-cpu,half 2 "$gguf" "$out/llama_cpp_${model}_${type}_same_call.json"
  else echo "no llama-bench or GGUF here (a fresh machine): ours alone"; fi
  timeout 150 python3 -m wisp bench prefill --load-format dummy --model "$wmodel" --mode hybrid-zero-copy \
    --hot-experts "${HOT:-62}" --prompt-len 512,2048 --out "$out/prefill_${wmodel}_half_hybrid.json" 2>"$out/prefill_half.log" | tail -2
  ours router
  [ -n "${OLD:-}" ] && (cd "$OLD" && PYTHONPATH=$PWD timeout 180 $decode --vram-budget "$HALF" --routing-trace uniform \
    --out "$out/decode_${wmodel}_half_hybrid_uniform_old_tree.json" 2>"$out/decode_half_old.log" | tail -1) ;;
pair_big)
  placements=${PLACEMENTS:-all-cpu,half}; wmodel=${WISP_MODEL:-$model}; hot=${HOT:-0}
  [[ ,$placements, == *,half,* ]] && : "${HALF:?HALF: bytes, the --vram-budget of the wisp run at the half placement}"
  routing=${ROUTING:-uniform}; trace=(--routing-trace "$routing"); rname=$routing
  [ "$routing" = router ] && trace=()  # router: the model's own (random) router picks the experts
  [ "$routing" = uniform ] || [ "$routing" = router ] || rname=trace
  summary="$out/pair_big_summary.txt"; deadline=${BUDGET_S:-575}  # seconds since the script began
  note() { echo "[${SECONDS}s] $*" | tee -a "$summary"; }
  slot() {  # a step's timeout: $1 s, or what is left before the deadline less 15 s for packing; fails under $2 s
    local left=$(( deadline - SECONDS - 15 )); local t=$(( $1 < left ? $1 : left ))
    [ "$t" -ge "$2" ] && echo "$t"
  }
  ours() {  # $1: the records' name (log beside them), then the command's flags: one wisp run under its slot
    local name=$1 t rc; shift
    if ! t=$(slot "${WISP_TIMEOUT:-200}" 90); then note "$name: skipped, $(( deadline - SECONDS ))s left of BUDGET_S"; return; fi
    timeout "$t" python3 -m wisp bench "$@" --out "$out/$name.json" 2>"$out/$name.log" | tail -2; rc=${PIPESTATUS[0]}
    note "$name: exit $rc$([ "$rc" = 124 ] && echo ": timed out after ${t}s")"
  }
  lscpu | grep -E "Model name|^CPU\(s\)" > "$out/host.txt"; free -g >> "$out/host.txt"
  gguf=${GGUF_DIR:-/dev/shm}/$model-$type.gguf
  if gguf_and_build "$gguf" && [ -x "$bench" ]; then
    note "GGUF written ($(du -h "$gguf" | cut -f1)), llama-bench built"; free -g | tail -2 >> "$out/host.txt"
    if t=$(slot "${PEER_TIMEOUT:-240}" 60); then
      llama_bench "$t" "$placements" "${REPS:-1}" "$gguf" "$out/llama_cpp_${model}_${type}.json"
      rc=$?; note "llama-bench: exit $rc$([ "$rc" = 124 ] && echo ": timed out after ${t}s")"
    else note "llama-bench skipped: $(( deadline - SECONDS ))s left"; fi
  else note "no GGUF or no llama-bench (gguf.log, build.txt): llama.cpp skipped"; fi
  rm -f "$gguf"  # its RAM (GGUF_DIR=/dev/shm) goes to wisp's pinned experts
  if [ "${HALF:-}" = auto ]; then  # llama.cpp's half nvidia-smi peak in this call, less a bare CUDA context measured here
    python3 -m wisp bench llama-cpp peak --out "$out/context.json" -- python3 -c "import torch, time
a = torch.ones(64, 64, device='cuda'); (a @ a).sum().item(); time.sleep(1)" > /dev/null 2>&1
    HALF=$(python3 -c "import json; half = [r for r in json.load(open('$out/llama_cpp_${model}_${type}.json')) if r['placement'] == 'half']
print(half[0]['peak_gpu_bytes'] - json.load(open('$out/context.json'))['peak_gpu_bytes'])" 2>/dev/null) || HALF=""
    note "HALF=auto: ${HALF:-no llama.cpp half record: the half decode is skipped}"
    [ -n "$HALF" ] || placements=${placements//half/}
  fi
  decode=(decode --load-format dummy --model "$wmodel" --prompt-len 512 --decode-tokens 64 --mode hybrid-zero-copy)
  for placement in ${placements//,/ }; do
    case $placement in
      all-cpu) ours "decode_${wmodel}_all_cpu_hybrid_$rname" "${decode[@]}" --hot-experts 0 "${trace[@]}" ;;
      half) ours "decode_${wmodel}_half_hybrid_$rname" "${decode[@]}" --vram-budget "$HALF" "${trace[@]}" ;;
      *) note "$placement: no wisp run for it (all-cpu and half only)" ;;
    esac
  done
  ours "prefill_${wmodel}_hybrid_hot$hot" prefill --load-format dummy --model "$wmodel" --mode hybrid-zero-copy \
    --hot-experts "$hot" --prompt-len 512,2048
  python3 - "$out" "$model" "$type" "$wmodel" "$rname" "$hot" <<'PY' | tee -a "$summary"
import json, sys
from pathlib import Path
out, model, kind, wmodel, routing, hot = sys.argv[1:]
def records(name):
    f = Path(out) / name
    return json.loads(f.read_text()) if f.is_file() else []
gb = lambda b: "-" if b is None else f"{b / 1e9:.2f} GB"
peer = {r["placement"]: r for r in records(f"llama_cpp_{model}_{kind}.json")}
for placement, r in peer.items():
    print(f"llama.cpp {placement}: decode {r['decode_tok_s']} tok/s, TTFT {r['ttft_s']} s, GPU peak {gb(r.get('peak_gpu_bytes'))}")
for placement in ("all-cpu", "half"):
    for r in records(f"decode_{wmodel}_{placement.replace('-', '_')}_hybrid_{routing}.json"):
        theirs = peer.get(placement, {}).get("decode_tok_s")
        ratio = f" = {r['decode_tok_s'] / theirs:.2f}x llama.cpp" if theirs and r.get("decode_tok_s") else ""
        print(f"wisp {placement} ({routing} routing, {r.get('hot_experts')} hot experts a layer): decode "
              f"{r.get('decode_tok_s')} tok/s{ratio}, GPU peak {gb(r.get('peak_gpu_bytes'))}")
for r in records(f"prefill_{wmodel}_hybrid_hot{hot}.json"):
    print(f"wisp prefill ({hot} hot experts a layer): TTFT {r.get('prompt_len')} tokens {r.get('ttft_s')} s, "
          f"GPU peak {gb(r.get('peak_gpu_bytes'))}")
PY
  # the device tool returns at most 8 files: records and the summary stay, every log travels in one archive
  # (written beside $out, then moved in: tar reading the folder it writes into warns and exits 1)
  logs=$(cd "$out" && ls -A | grep -v -e '\.json$' -e '_summary\.txt$')
  [ -n "$logs" ] && tar czf "$out.pair_big_logs.tgz" -C "$out" $logs && (cd "$out" && rm -f $logs) \
    && mv "$out.pair_big_logs.tgz" "$out/pair_big_logs.tgz"
  ls "$out" ;;
wisp)
  wmodel=${WISP_MODEL:-$model}
  routing=${ROUTING:-.gpu_data/olmoe_1b7b_layer0_gsm8k_KaxitPandya.jsonl}
  peak="-m wisp bench llama-cpp peak"; mkdir -p "$out/runs"
  python3 $peak --out "$out/context.json" -- python3 -c "import torch, time
a = torch.ones(64, 64, device='cuda'); (a @ a).sum().item(); time.sleep(1)"
  context=$(python3 -c "import json; print(json.load(open('$out/context.json'))['peak_gpu_bytes'])")
  # RUNS: placement:llama.cpp's nvidia-smi peak there:our modes (the first also runs the TTFT prompts)
  for run in ${RUNS:?RUNS: placement:bytes:mode,mode ...}; do
    IFS=: read -r placement budget modes <<< "$run"; first_mcap=""
    cap=$(python3 -c "from wisp.models.config_parsers import model_config; from wisp.models.presets import preset
from wisp.plan.sizes import cap_for_budget; print(cap_for_budget(model_config(preset('$wmodel')), $budget - $context, 2112))")
    echo "$placement: llama.cpp $budget bytes, bare CUDA context $context: cap $cap"
    first_flags=()
    for spec in ${modes//,/ }; do  # mode[@cap][+hotH][+eager]: hybrid@0 is hybrid with no slots; +hot33: 33 hot
      mode=${spec%%[@+]*}; mcap=$cap; name=$mode; flags=()  # experts a layer on the GPU; +eager: no CUDA graphs
      if [[ $spec == *@* ]]; then mcap=${spec#*@}; mcap=${mcap%%+*}; name+="_c$mcap"; fi
      if [[ $spec =~ \+hot([0-9]+) ]]; then flags+=(--hot-experts "${BASH_REMATCH[1]}"); name+="_hot${BASH_REMATCH[1]}"; fi
      [ -z "${first_mcap:-}" ] && first_mcap=$mcap && first_flags=("${flags[@]}")
      if [[ $spec == *+eager ]]; then flags+=(--enforce-eager); name+="_eager"; fi
      timeout 200 python3 $peak --out "$out/runs/smi_decode_${placement}_$name.json" -- python3 -m wisp bench decode \
        --load-format dummy --model "$wmodel" --mode "$mode" --expert-cap "$mcap" --prompt-len 512 --decode-tokens 64 \
        "${flags[@]}" --routing-trace "$routing" --out "$out/runs/decode_${placement}_$name.json" \
        2>"$out/runs/decode_${placement}_$name.log" | tail -1
    done
    mode=${modes%%[,@+]*}  # the first spec's mode, cap and hot experts
    for chunk in ${PREFILL_CHUNKS-2048}; do  # tokens per prefill step (llama.cpp: 512); PREFILL_CHUNKS="": none
      timeout 200 python3 $peak --out "$out/runs/smi_prefill_${placement}_${mode}_$chunk.json" -- python3 -m wisp bench prefill \
        --load-format dummy --model "$wmodel" --mode "$mode" --expert-cap "$first_mcap" "${first_flags[@]}" --prompt-len 512,2048 \
        --max-num-batched-tokens "$chunk" --out "$out/runs/prefill_${placement}_${mode}_$chunk.json" \
        2>"$out/runs/prefill_${placement}_${mode}_$chunk.log" | tail -3
    done
  done
  python3 - "$out" "$wmodel" "$context" "$RUNS" <<'PY'
import json, sys
from pathlib import Path
out, model, context = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
budgets = {run.split(":")[0]: int(run.split(":")[1]) for run in sys.argv[4].split()}
for kind in ("decode", "prefill"):
    records = []
    for placement, budget in budgets.items():
        for f in sorted((out / "runs").glob(f"{kind}_{placement}_*.json")):
            smi_file = out / "runs" / f"smi_{f.name}"
            peak = json.loads(smi_file.read_text())["peak_gpu_bytes"] if smi_file.is_file() else None
            if peak is None:
                print(f"warning: no nvidia-smi peak for {f.name}: its records say within_budget null", file=sys.stderr)
            for r in json.loads(f.read_text()):
                r.update(placement=placement, vram_budget_nvidia_smi=budget, peak_gpu_bytes_nvidia_smi=peak,
                         cuda_context_bytes=context, within_budget=None if peak is None else peak <= budget)
                records.append(r)
    (out / f"{kind}_{model}_vs_llama_cpp.json").write_text(json.dumps(records, indent=1) + "\n")
    for r in records:
        print(kind, r["placement"], r["mode"], r.get("expert_cap"), r.get("prompt_len"), "tok/s", r.get("decode_tok_s"),
              "TTFT", r.get("ttft_s"), "smi", r["peak_gpu_bytes_nvidia_smi"], "within", r["within_budget"])
PY
  ;;
esac
