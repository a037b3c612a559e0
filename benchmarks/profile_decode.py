"""Profile eager decode steps of a preset (fewer layers) and print the kernels by total GPU time.

python benchmarks/profile_decode.py --model qwen3-30b-a3b --layers 8 --mode resident
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import wisp.models.presets as presets
from wisp import LLM, SamplingParams

p = argparse.ArgumentParser()
p.add_argument("--model", default="qwen3-30b-a3b")
p.add_argument("--layers", type=int, default=8)
p.add_argument("--mode", default="resident")
p.add_argument("--cap", type=int, default=None)
args = p.parse_args()
base = presets.preset(args.model)
presets.PRESETS[args.model] = dict(base, num_hidden_layers=args.layers)
llm = LLM(args.model, load_format="dummy", mode=args.mode, expert_cap=args.cap, max_concurrency=1, max_model_len=512,
          enforce_eager=True)
prompt = list(range(1, 129))
llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))
eng = llm.engine
eng.add_request("x", prompt, SamplingParams(max_tokens=40, ignore_eos=True))
eng.step()
for _ in range(4):
    eng.step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        eng.step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
