"""`wisp bench accuracy`: how close hybrid mode's outputs are to resident, as the max abs logit difference and
greedy-token agreement.

    wisp bench accuracy --model demo --out benchmarks/results/logs/hybrid_accuracy_cpu_demo.json
    wisp bench accuracy --model mixtral-8x7b --load-format dummy --device cuda --expert-cap 2 ...

For each prompt (`--prompts` random token-id prompts of `--prompt-len`, seeded) the model runs twice: resident
(every expert on the device) and `--mode hybrid` at `--expert-cap` (or, `--against resident-torch`, resident on
the torch MoE kernels: what a mere change of GEMM rounding does to the same model, the yardstick for hybrid),
each a greedy prefill + `--decode-tokens` decode with the logits of every step kept. Hybrid runs with the plain
CPU kernel (torch's GEMM on exactly the routed rows, as on a GPU) and, unless `--probe` is given, with costs
that make the CPU take every step's light misses (so the comparison exercises the CPU path hard; `--probe`
uses the machine's own calibrated costs). Reported per prompt and over all: the max abs logit difference over
the prefill's last position and every decode step while the two greedy sequences agree (after the first
disagreement the contexts differ and logits are no longer comparable), the first step where the greedy tokens
differ (or none), and the share of decode tokens equal position by position. Prints a table and writes JSON
(`--out`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from wisp.core.learners.hybrid_costs import HybridCosts
from wisp.engine.llm import LLM
from wisp.engine.sampling import SamplingParams

CPU_TAKES_LIGHT_MISSES = HybridCosts(copy_s=1.0, cpu_rows=(1, 64), cpu_s_at_rows=(0.1, 6.4))


def run(model: str, mode: str, prompt: list[int], args, **extra) -> tuple[torch.Tensor, list[int], list[torch.Tensor], dict]:
    llm = LLM(model, mode=mode, device=args.device, load_format=args.load_format, dtype=args.dtype,
              max_model_len=args.prompt_len + args.decode_tokens + 8, **extra)
    prefill = llm.prompt_logits(prompt)[-1].float().cpu()
    out = llm.generate([prompt], SamplingParams(max_tokens=args.decode_tokens, ignore_eos=True), return_logits=True)[0]
    return prefill, out.token_ids, [x.float().cpu() for x in out.logits], llm.stats()


def compare(args) -> dict:
    g = torch.Generator().manual_seed(args.seed)
    hybrid_opts = dict(expert_cap=args.expert_cap, hybrid_cpu_kernel="plain")
    if not args.probe:
        hybrid_opts["hybrid_costs"] = CPU_TAKES_LIGHT_MISSES
    records = []
    for i in range(args.prompts):
        prompt = torch.randint(3, args.vocab_limit, (args.prompt_len,), generator=g).tolist()
        ref_prefill, ref_ids, ref_logits, _ = run(args.model, "resident", prompt, args)
        if args.against == "hybrid":
            hyb_prefill, hyb_ids, hyb_logits, stats = run(args.model, "hybrid", prompt, args, **hybrid_opts)
        else:  # the noise floor: resident with the torch MoE kernels, whose GEMMs round otherwise
            hyb_prefill, hyb_ids, hyb_logits, stats = run(args.model, "resident", prompt, args, moe_backend="torch")
        diverge = next((j for j, (a, b) in enumerate(zip(ref_ids, hyb_ids)) if a != b), None)
        compared = len(ref_ids) if diverge is None else diverge + 1  # the step that diverges still saw equal contexts
        diffs = [float((ref_prefill - hyb_prefill).abs().max())]
        diffs += [float((a - b).abs().max()) for a, b in zip(ref_logits[:compared], hyb_logits[:compared])]
        records.append({
            "prompt": i, "max_abs_logit_diff": max(diffs), "logit_scale": float(ref_prefill.abs().max()),
            "first_divergence": diverge, "greedy_agreement": sum(a == b for a, b in zip(ref_ids, hyb_ids)) / len(ref_ids),
            "experts_on_cpu": stats.get("expert_cpu_computed", 0), "expert_misses": stats.get("expert_misses", 0),
        })
        print(f"prompt {i}: max |logit diff| {records[-1]['max_abs_logit_diff']:.3g} (logits up to "
              f"{records[-1]['logit_scale']:.3g}), first divergence {diverge}, agreement "
              f"{records[-1]['greedy_agreement']:.3f}, {records[-1]['experts_on_cpu']} of {records[-1]['expert_misses']} "
              f"misses on the CPU")
    summary = {
        "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in records),
        "greedy_agreement": sum(r["greedy_agreement"] for r in records) / len(records),
        "prompts_fully_equal": sum(r["first_divergence"] is None for r in records),
    }
    print(f"all: max |logit diff| {summary['max_abs_logit_diff']:.3g}, greedy agreement "
          f"{summary['greedy_agreement']:.3f}, {summary['prompts_fully_equal']}/{len(records)} prompts identical")
    config = {k: v for k, v in vars(args).items() if k not in ("command", "bench", "run_bench")}
    return {"config": config, "summary": summary, "prompts": records,
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "command": "wisp " + " ".join(sys.argv[1:])}


def bench_accuracy(args) -> dict:
    """`wisp bench accuracy`: the comparison, printed, and written to `--out` when given."""
    result = compare(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result
