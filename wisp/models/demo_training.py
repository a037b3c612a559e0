"""Train the built-in demo (`wisp.models.demo`) on Python's documentation, deterministically, on the CPU.

    python -m wisp.models.demo_training --out wisp/models/demo_checkpoint      # from a clone: the shipped demo

What it does (needs transformers, which the test extra installs):
- builds transformers' Qwen3-MoE in `DEMO_CONFIG`'s shape, its experts on the "eager" implementation (the fastest
  on a small CPU), from `--seed`;
- trains `--steps` AdamW steps (linear warm-up, cosine decay to a tenth) on random `--context`-byte windows of the
  training text (`wisp.models.demo_text`), minimising next-byte cross-entropy plus `--aux-loss` times transformers'
  load-balancing loss, so that routing spreads over the experts and paging has work to do;
- every `--eval-every` steps, scores the held-out text (`wisp.models.text_scoring`, windows of `EVAL_WINDOW`);
- rounds the weights to float16 (the shipped storage), scores the held-out text again with them (the figure wisp must
  reproduce), and writes the checkpoint in the hub's per-expert layout: config.json (`DEMO_CONFIG`),
  model.safetensors, the tokenizer files, and training.json (settings, loss curve, wall time, figures, digests);
- then `ROUTING_COMMAND` (wisp's engine, not this module's transformers) scores the held-out text again and records
  its routing beside the weights (routing_held_out.npz).

Determinism: the batches come from a generator seeded by `--seed`, and torch runs `--threads` threads, so the same
command on the same CPU model and torch build writes the same bytes (training.json records the weights' SHA-256;
only its wall times differ). Another CPU model may pick other SIMD kernels, whose float sums round differently.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from wisp.models.demo import DEMO_CONFIG, TRAINED_DEMO_SAMPLING, byte_tokenizer, write_tokenizer_files
from wisp.models.demo_text import SCORE_WINDOW, demo_text, digest
from wisp.models.text_scoring import score

ROUTING_COMMAND = ("wisp bench perplexity --model demo --record-routing wisp/models/demo_checkpoint/routing_held_out.npz "
                   "--out benchmarks/results/logs/demo_held_out_perplexity.json")
EVAL_WINDOW = SCORE_WINDOW  # also the training context: positions past it are never trained
STORAGE_DTYPE = torch.float16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m wisp.models.demo_training", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True,
                   help="the checkpoint folder to write (the shipped demo's: wisp/models/demo_checkpoint in a clone)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=EVAL_WINDOW)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--aux-loss", type=float, default=0.01)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=100)
    return p.parse_args(argv)


def hf_model(seed: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    fields = {k: v for k, v in DEMO_CONFIG.items() if k not in ("architectures", "model_type")}
    return Qwen3MoeForCausalLM._from_config(Qwen3MoeConfig(**fields), experts_implementation="eager")


def token_ids(text: str) -> torch.Tensor:
    ids = byte_tokenizer().encode(text).ids
    assert len(ids) == len(text.encode()), "the demo's tokenizer gives one token a byte"
    return torch.tensor(ids, dtype=torch.long)


def held_out_bits(model, ids: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        s = score(ids.tolist(), lambda chunk: model(input_ids=torch.tensor([chunk])).logits[0], EVAL_WINDOW)
    model.train()
    return s.bits_per_token


def learning_rate(step: int, steps: int, peak: float, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def hub_tensors(model) -> dict[str, torch.Tensor]:
    """The model's weights under the hub's per-expert names, in `STORAGE_DTYPE`."""
    out = {}
    inter = DEMO_CONFIG["moe_intermediate_size"]
    for name, p in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
            stem = name.removesuffix("gate_up_proj")
            for e in range(p.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = p[e, :inter]
                out[f"{stem}{e}.up_proj.weight"] = p[e, inter:]
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            stem = name.removesuffix("down_proj")
            for e in range(p.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = p[e]
        else:
            out[name] = p
    return {k: v.detach().to(STORAGE_DTYPE).contiguous() for k, v in out.items()}


def train(args: argparse.Namespace, command: str, log=print) -> dict:
    torch.set_num_threads(args.threads)
    train_ids, held_ids = token_ids(demo_text("train")), token_ids(demo_text("held-out"))
    model = hf_model(args.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    batches = torch.Generator().manual_seed(args.seed)
    span = torch.arange(args.context + 1)
    curve, interval_bits, t0 = [], [], time.perf_counter()
    for step in range(args.steps):
        starts = torch.randint(0, len(train_ids) - args.context - 1, (args.batch,), generator=batches)
        x = train_ids[starts[:, None] + span]  # [B, context + 1]
        out = model(input_ids=x[:, :-1], output_router_logits=True)
        ce = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), x[:, 1:].flatten())
        loss = ce + args.aux_loss * out.aux_loss
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        interval_bits.append(ce.item() / math.log(2))
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            point = {"step": step + 1, "seconds": round(time.perf_counter() - t0, 1),
                     "train_bits_per_byte": round(sum(interval_bits) / len(interval_bits), 4),
                     "held_out_bits_per_byte": round(held_out_bits(model, held_ids), 4),
                     "balance_loss": round(out.aux_loss.item(), 4)}
            curve.append(point)
            interval_bits = []
            log(json.dumps(point))
    wall = time.perf_counter() - t0
    tensors = hub_tensors(model)
    with torch.no_grad():  # the shipped weights: rounded to the storage dtype, computed in float32
        for p in model.parameters():
            p.copy_(p.to(STORAGE_DTYPE).float())
    shipped_bits = held_out_bits(model, held_ids)
    log(f"held-out bits/byte with the {str(STORAGE_DTYPE).removeprefix('torch.')} weights: {shipped_bits:.4f}")
    return {"tensors": tensors, "record": {
        "command": command,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "train_seconds": round(wall, 1), "tokens_per_second": round(args.steps * args.batch * args.context / wall),
        "held_out_bits_per_byte": round(shipped_bits, 5), "eval_window": EVAL_WINDOW,
        "text_sha256": digest(), "curve": curve,
        "platform": {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
                     "processor": _cpu_name()}}}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_checkpoint(out: Path, tensors: dict[str, torch.Tensor], record: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(DEMO_CONFIG, indent=1) + "\n")
    write_tokenizer_files(out, TRAINED_DEMO_SAMPLING)
    record["weights_sha256"] = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    record["weights_bytes"] = (out / "model.safetensors").stat().st_size
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = train(args, " ".join(["python -m wisp.models.demo_training", *(sys.argv[1:] if argv is None else argv)]))
    write_checkpoint(args.out, result["tensors"], result["record"])
    print(f"wrote {args.out} ({result['record']['weights_bytes']} bytes of weights, "
          f"{result['record']['train_seconds']} s of training)")
    print(f"then record its routing with wisp: {ROUTING_COMMAND}")


if __name__ == "__main__":
    main()
