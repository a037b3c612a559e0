"""`wisp bench profile sampling`: what a decode step's sampling costs, alone, at batch sizes and sampling parameters.

Random logits [B, V] on the device (float32, as the model's head gives them) are sampled by the engine's own step
sampler (`wisp.engine.sequence_sampling.sample_sequences`: each request's row prepared, the tokens drawn together on
the device and read to the host once), B fresh requests a batch; the median of `--repeats` steps, after two warm-ups,
in ms a step and a request. Sampling presets: greedy (temperature 0), temperature (0.8), top-p (0.7, top-p 0.95) and
qwen3 (Qwen3's recommended 0.7, top-p 0.8, top-k 20).

    wisp bench profile sampling --vocab 151936 --batch 1,16 --out sampling.json
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from wisp.config import resolve_device
from wisp.engine.sampling import SamplingParams
from wisp.engine.sequence import Sequence
from wisp.engine.sequence_sampling import sample_sequences
from wisp.errors import WispError

PRESETS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=0.8),
    "top-p": SamplingParams(temperature=0.7, top_p=0.95),
    "qwen3": SamplingParams(temperature=0.7, top_p=0.8, top_k=20),
}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(logits: torch.Tensor, params: SamplingParams, repeats: int) -> float:
    """The median ms of sampling every row of `logits` [B, V], each row a new request with `params`."""
    times = []
    for i in range(repeats + 2):
        seqs = [Sequence(f"r{b}", [0], SamplingParams(**{**params.__dict__, "seed": i * 1000 + b}), 8)
                for b in range(logits.shape[0])]
        _synchronize(logits.device)
        start = time.perf_counter()
        sample_sequences(seqs, logits)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def profile_sampling(args) -> dict:
    unknown = [p for p in args.params.split(",") if p not in PRESETS]
    if unknown:
        raise WispError(f"unknown sampling preset {unknown[0]!r}; choose from {', '.join(PRESETS)}")
    device = resolve_device(args.device)
    torch.manual_seed(0)
    rec = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "vocab": args.vocab,
           "threads": torch.get_num_threads(), "steps": {}}
    for batch in args.batch:
        logits = torch.randn((batch, args.vocab), device=device) * 4
        for name in args.params.split(","):
            ms = step_ms(logits, PRESETS[name], args.repeats)
            rec["steps"][f"{name}/batch_{batch}"] = {"ms_a_step": round(ms, 3), "ms_a_request": round(ms / batch, 3)}
            print(f"{name:12s} batch {batch:3d}: {ms:8.3f} ms a step, {ms / batch:7.3f} a request", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rec, indent=1))
    return rec
