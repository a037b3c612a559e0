"""Question: how much does a grammar-constrained request slow the requests decoding beside it?

Asked: 2026-12-04 (issue 42: "a constrained request must not slow the others in its batch by more than you measure
and state").

Measured: a tiny random Qwen3-MoE (hidden 128, 4 layers, 16 experts, top-4) with Qwen3's vocabulary width (151,936)
and a synthetic byte-level tokenizer of that size (`grammar_mask_cost.synthetic_vocab`, written as a tokenizer.json
whose BPE has no merges: the grammar engine sees every token's bytes), so that the mask's cost is at Qwen3's scale
while the model's step is small and the mask's share of it shows. Eight requests decode together, 64 tokens each,
temperature 1 (a random model's walk through the grammar): all free; one constrained by an agent's tool-call JSON
schema and seven free; all eight constrained. Reported per arm: the engine's decode step time (every request of the
batch waits for it, so it is the free requests' inter-token latency), p50 and mean over the steps where all eight
ran, and the difference from the all-free arm. The device's step is the same in every arm (a grammar only masks its
own logits row after the step); what a constrained request adds is its mask, computed on the CPU.

    python benchmarks/probes/constrained_neighbours.py [--device cpu|cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_mask_cost import TOOL_CALL, VOCAB_SIZE, synthetic_vocab  # noqa: E402

from wisp import LLM, SamplingParams  # noqa: E402
from wisp.engine.grammar import json_schema_grammar  # noqa: E402
from wisp.models.demo import DEMO_CONFIG  # noqa: E402
from wisp.models.random_checkpoint import write_random_checkpoint  # noqa: E402

BATCH, TOKENS, PROMPT = 8, 64, 32


def byte_level_alphabet() -> dict[int, str]:
    """Each byte's printable stand-in in byte-level BPE vocabularies (printable Latin-1 bytes stand for themselves,
    the others are shifted past 255 in order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, shift = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + shift)
            shift += 1
    return out


def write_model(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = synthetic_vocab()
    alphabet = byte_level_alphabet()
    vocab = {"".join(alphabet[b] for b in t): i for i, t in enumerate(tokens[:-1])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokens[-1].decode()])
    config = {**DEMO_CONFIG, "vocab_size": VOCAB_SIZE, "eos_token_id": VOCAB_SIZE - 1}
    write_random_checkpoint(config, folder, seed=7)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": tokens[-1].decode()}))
    return folder


def arm(llm: LLM, constrained: int, seed: int) -> list[float]:
    """Decode step times (s) of one batch of BATCH requests, `constrained` of them under the tool-call schema, over
    the steps where all of them ran."""
    engine = llm.engine
    gen = torch.Generator().manual_seed(seed)
    grammar = json_schema_grammar(TOOL_CALL)
    for i in range(BATCH):
        prompt = torch.randint(0, VOCAB_SIZE - 1, (PROMPT,), generator=gen).tolist()
        params = SamplingParams(max_tokens=TOKENS, temperature=1.0, seed=seed + i, ignore_eos=i >= constrained)
        engine.add_request(f"r{i}", prompt, params,
                           constraint=engine.grammars.constraint(grammar) if i < constrained else None)
    times = []
    while engine.has_unfinished():
        running = len(engine.scheduler.running)
        start = time.perf_counter()
        outs = engine.step()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        if running == BATCH and len(outs) == BATCH and all(len(o.token_ids) > 1 for o in outs):
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        llm = LLM(str(write_model(Path(tmp))), device=args.device, mode="resident", max_concurrency=BATCH,
                  max_model_len=PROMPT + TOKENS + 16)
        llm.engine.grammars.tokenizer  # built before timing (seconds at this vocabulary)
        arm(llm, 1, 99)  # warm-up
        results = {}
        for constrained in (0, 1, BATCH):
            steps = [t for r in range(args.repeats) for t in arm(llm, constrained, r)]
            results[constrained] = {"steps": len(steps), "p50_ms": statistics.median(steps) * 1e3,
                                    "mean_ms": statistics.fmean(steps) * 1e3}
    base = results[0]
    for constrained, r in results.items():
        r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
        r["added_mean_ms"] = r["mean_ms"] - base["mean_ms"]
        print(f"{constrained} of {BATCH} constrained: step p50 {r['p50_ms']:.2f} ms, mean {r['mean_ms']:.2f} ms "
              f"(+{r['added_p50_ms']:.2f} / +{r['added_mean_ms']:.2f} ms against none), {r['steps']} steps")
    if args.out:
        device = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
        Path(args.out).write_text(json.dumps({"device": device, "batch": BATCH, "tokens": TOKENS,
                                              "vocab_size": VOCAB_SIZE, "arms": results}, indent=1))


if __name__ == "__main__":
    main()
