#!/usr/bin/env bash
# A/B of Qwen3-30B-A3B batch-1 decode between an older commit and the working tree, on one GPU in one call,
# alternating twice (the README table's command). Prepare the old tree here first (ignored by git, carried
# with the device tool's `carry: [".gpu_data"]`):
#   rm -rf .gpu_data/old && mkdir -p .gpu_data/old && git archive <REV> wisp | tar -x -C .gpu_data/old
set -u
out=${OUT:-gpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
args="bench decode --load-format dummy --prompt-len 128 --model qwen3-30b-a3b --mode resident,paged --expert-cap 16,32 --decode-tokens 128"
for round in 1 2; do
  (cd .gpu_data/old && PYTHONPATH=$PWD python3 -m wisp $args --out "$out/ab_before_r$round.json" 2>"$out/ab_before_r$round.log" | tail -4)
  PYTHONPATH=$PWD python3 -m wisp $args --out "$out/ab_after_r$round.json" 2>"$out/ab_after_r$round.log" | tail -4
done
