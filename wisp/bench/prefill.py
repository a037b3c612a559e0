"""`wisp bench prefill`: cold time to first token against prompt length, per expert mode and cap.

Each (mode, cap) run loads the model once (prefix caching off, so every prompt is cold), then for each
`--prompt-len` P (ascending) runs one untimed random prompt of length P (kernels compiled for its
shapes; the expert slots then hold what it left, as after any earlier request) and times another
from `add_request` to its first sampled token, under the engine's token budget
(`--max-num-batched-tokens`: a prompt longer than it is prefilled in chunks). A record per (run, P):
`ttft_s`, the bytes copied host -> device and expert loads per MoE layer during that prefill, and the
distinct experts the prompt routed to that were not on the device when it arrived (`distinct_missing`,
all MoE layers together; in offload and zero-copy mode every routed expert), the fewest loads any
schedule could do. `bound_s` = max(resident TTFT at P, distinct_missing x expert bytes
/ the pinned probe bandwidth measured in the same process); `ttft_over_bound` is the ratio the targets
are written against. `--plot FILE.png` draws TTFT against P, one line per run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from wisp.bench.decode import _git_commit, _peak, options_for, probe_h2d_gbps
from wisp.cli_args import backend_options
from wisp.config import MODES, resolve_device
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams
from wisp.errors import WispError
from wisp.options import SCRATCH_MODES


class RoutedUnion:
    """Per MoE layer, the set of experts routed since `reset`, kept on the device (no host sync): a
    routing observer of the engine's runner (`ModelRunner.add_routing_observer`)."""

    def __init__(self, layers: list[int], num_experts: int, device: torch.device):
        self.row = {layer: i for i, layer in enumerate(layers)}
        self.seen = torch.zeros((len(layers), num_experts), dtype=torch.bool, device=device)

    def reset(self) -> None:
        self.seen.zero_()

    def begin_step(self) -> None:
        """Steps are not told apart: the union spans them all."""

    def record(self, layer: int, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        self.seen[self.row[layer], topk_ids.reshape(-1)] = True


def _resident_mask(llm: LLM, union: RoutedUnion) -> torch.Tensor:
    """[L, N] True where an expert sits on the device now: every expert in resident mode, a paged layer's
    slots, none in offload and zero-copy mode (each routed expert must cross PCIe)."""
    mask = torch.zeros(union.seen.shape, dtype=torch.bool)
    for layer, store in llm.model.experts.items():
        mask[union.row[layer], store.resident_experts()] = True
    return mask


def run_prefill(model: str, mode: str, cap: int | None, opts: dict, prompt_lens: list[int]) -> list[dict]:
    t0 = time.perf_counter()
    opts = options_for(opts, mode, cap)
    llm = LLM(model, mode=mode, expert_cap=cap, max_concurrency=1, max_model_len=max(prompt_lens) + 16,
              enable_prefix_caching=False, **opts)
    load_s = time.perf_counter() - t0
    union = RoutedUnion(llm.config.moe_layer_ids, llm.config.num_experts, llm.engine.device)
    records = []
    for p in sorted(prompt_lens):
        records.append(_measure_prefill(llm, union, p, load_s))
        if opts.get("hot_experts"):
            records[-1]["hot_experts"] = opts["hot_experts"]
        print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    return records


def _measure_prefill(llm: LLM, union: RoutedUnion, p: int, load_s: float) -> dict:
    """One cold prompt of length p timed to its first token, after an untimed one of the same length."""
    engine, cfg, device = llm.engine, llm.config, llm.engine.device
    prompt = torch.randint(0, cfg.vocab_size, (p,), generator=torch.Generator().manual_seed(p)).tolist()
    # an untimed prompt of the same length first: kernels specialised on its shapes are compiled
    other = torch.randint(0, cfg.vocab_size, (p,), generator=torch.Generator().manual_seed(p + 1)).tolist()
    llm.generate([other], SamplingParams(max_tokens=1, ignore_eos=True))
    llm.reset_stats()
    if device.type == "cuda":  # the peak only: emptying the cache would make the timed prompt allocate afresh
        torch.cuda.reset_peak_memory_stats(device)
    resident = _resident_mask(llm, union)
    union.reset()
    observing = engine.runner.add_routing_observer(union)
    ttft, steps = _time_to_first_token(engine, f"prefill-{p}", prompt)
    observing.remove()
    engine.abort_request(f"prefill-{p}")
    s, n_layers = llm.stats(), len(cfg.moe_layer_ids)
    return {
        "mode": engine.config.mode, "expert_cap": llm.expert_cap, "layers": cfg.num_layers, "prompt_len": p,
        "prefill_tokens": s["tokens_prefilled"], "prefill_steps": steps, "load_s": round(load_s, 2),
        "ttft_s": round(ttft, 4), "bytes_h2d": s["bytes_h2d"],
        "expert_loads_per_layer": round(s["expert_loads"] / n_layers, 2),
        "distinct_missing": int((union.seen.cpu() & ~resident).sum()),  # all MoE layers together
        "distinct_routed_per_layer": round(float(union.seen.sum()) / n_layers, 2),
        "expert_bytes": cfg.expert_bytes, "expert_device_bytes": s["expert_device_bytes"],
        "peak_gpu_bytes": _peak(device), "device": str(device),
        "max_num_batched_tokens": engine.config.max_num_batched_tokens, "embedding": s["embedding"],
    }


def _time_to_first_token(engine, rid: str, prompt: list[int]) -> tuple[float, int]:
    """Seconds from add_request to the first sampled token, and the engine steps that took."""
    t_start = time.perf_counter()
    engine.add_request(rid, prompt, SamplingParams(max_tokens=2, ignore_eos=True), strict_length=False)
    seq = engine.requests[rid]
    steps = 0
    while seq.first_token_time is None:
        engine.step()
        steps += 1
    return time.perf_counter() - t_start, steps


def bench_prefill(args) -> list[dict]:
    opts = {"load_format": args.load_format, "max_num_batched_tokens": args.max_num_batched_tokens,
            **backend_options(args)}
    caps = [int(c) for c in args.expert_cap.split(",")] if args.expert_cap else [None]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise WispError(f"unknown mode {bad[0]!r}; choose from: {', '.join(MODES)}")
    lens = sorted({int(p) for p in args.prompt_len.split(",")})
    runs = [(m, c) for m in sorted(modes, key=lambda m: m != "resident") for c in (caps if m in SCRATCH_MODES else [None])]
    device = resolve_device(args.device)
    gbps = probe_h2d_gbps(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    commit, records, resident_ttft = _git_commit(), [], {}
    for mode, cap in runs:
        for r in run_prefill(args.model, mode, cap, opts, lens):
            if mode == "resident":
                resident_ttft[r["prompt_len"]] = r["ttft_s"]
            copy_s = r["distinct_missing"] * r["expert_bytes"] / (gbps * 1e9) if gbps else 0.0
            bound = max(resident_ttft.get(r["prompt_len"], 0.0), copy_s)
            r.update(commit=commit, preset=args.model, load_format=args.load_format, moe_backend=args.moe_backend,
                     attention_backend=args.attention_backend, h2d_gbps_probe=round(gbps, 2), gpu=gpu,
                     min_copy_s=round(copy_s, 4), bound_s=round(bound, 4) if bound else None,
                     ttft_over_bound=round(r["ttft_s"] / bound, 3) if bound else None,
                     command="wisp bench prefill " + " ".join(sys.argv[3:]))
            records.append(r)
    print(f"{'mode':9} {'cap':>4} {'P':>6} {'TTFT s':>8} {'bound s':>8} {'ratio':>6} {'loads/l':>8} {'missing':>8} {'GB h2d':>7}")
    for r in records:
        bound = f"{r['bound_s']:8.3f}" if r["bound_s"] else "       -"
        ratio = f"{r['ttft_over_bound']:6.2f}" if r["ttft_over_bound"] else "     -"
        print(f"{r['mode']:9} {r['expert_cap']:>4} {r['prompt_len']:>6} {r['ttft_s']:>8.3f} {bound} {ratio} "
              f"{r['expert_loads_per_layer']:>8} {r['distinct_missing']:>8} {r['bytes_h2d'] / 1e9:>7.2f}")
    print(f"pinned H2D probe: {gbps:.1f} GB/s on {gpu}")
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    if args.plot:
        plot_ttft(records, args.plot)
    return records


def plot_ttft(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    runs: dict[str, list[dict]] = {}
    for r in records:
        runs.setdefault(r["mode"] + (f" C={r['expert_cap']}" if r["mode"] in SCRATCH_MODES else ""), []).append(r)
    for label, rs in runs.items():
        ax.plot([r["prompt_len"] for r in rs], [r["ttft_s"] for r in rs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (cold)")
    ax.set_ylabel("time to first token, s")
    ax.set_title(f"{records[0]['preset']} on {records[0]['gpu']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
