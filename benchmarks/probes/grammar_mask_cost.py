"""Question: which grammar engine should wisp's constrained decoding (structured output, tool calls) run on,
llguidance 1.9.1 or xgrammar 0.2.8, judged by what the token mask costs per decoded token at Qwen3's vocabulary
size (151,936 tokens)? (CPU for the masks and the matchers; `--device` for applying the masks to the logits.)

Asked: 2026-12-04.

Vocabulary: synthetic, because there is no model hub here to fetch Qwen3's tokenizer. It is shaped like a
byte-level BPE vocabulary: the 256 single bytes; the pieces of real English and code text (the text of CPython's
`pydoc_data.topics`, split the way GPT-2-style pre-tokenizers split: words with their leading space, digit runs,
punctuation runs, whitespace runs); every word lower-case, capitalised and upper-case, with and without a leading
space; word prefixes and suffixes (the sub-words BPE merges leave behind); the numbers 0-999; runs of spaces,
tabs and newlines; code and JSON fragments; accented Latin, Greek, Cyrillic and a seeded sample of CJK characters
(Qwen3's vocabulary holds many multi-byte tokens): about 50k tokens; then concatenations of a frequent piece and a
short word ending (seeded, weighted by frequency; mean token 7.9 bytes) until 151,935 distinct tokens, and an end-of-sequence token last (id 151,935). The pydoc text differs
between CPython versions, so the record keeps the vocabulary's sha256.

Grammars: "tool call", an agent's function call as a JSON schema (a "name" enum of three functions and an
"arguments" object with a string with maxLength, an integer with bounds, an enum, an array of strings with maxItems and a
nested object), and "json object", any JSON object. Both compact (no whitespace between JSON tokens, as
`wisp.engine.grammar` compiles them). Compile: cold (first compile), repeat (the same grammar again: xgrammar
answers from its cache, llguidance has none and compiles again), new matcher (xgrammar: `GrammarMatcher` from
the compiled grammar; llguidance: `deep_copy` of a fresh matcher) and the first mask of a fresh matcher.

Measured per decode step, at batch 1 and batch 8 (independent matchers stepping together; batch 8 through each
engine's batch calls: llguidance `fill_next_token_bitmask_par` / `consume_token_par` on an `LLExecutor`,
xgrammar `BatchGrammarMatcher.batch_fill_next_token_bitmask` / `batch_accept_token`): (i) mask, computing the
bitmask [B, 4748] int32 on the CPU; (ii) apply, copying it to `--device` and applying it to float32 logits
[B, 151936] with the engine's own `apply_token_bitmask_inplace` (timed with perf_counter and synchronize);
(iii) advance, the matchers taking the token. Each step's token is drawn uniformly at random (seeded) among the
tokens the mask allows, as a random-weight model samples: a walk alternates between the grammar's fixed text
(keys, punctuation, enum values: a few tokens allowed) and string interiors (about 90% of the vocabulary allowed);
"allowed" in the table is the mean share. A matcher that takes EOS starts over as a fresh matcher. `--tokens` steps
per walk; p50 / p90 / p99 / mean microseconds per step (all B rows together).

    python benchmarks/probes/grammar_mask_cost.py [--device cuda] [--tokens 256] [--out benchmarks/results/logs/grammar_mask_cost.json]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.metadata
import json
import os
import random
import re
import sys
import time

import numpy as np
import torch

VOCAB_SIZE = 151_936  # Qwen3's logits width
MASK_WORDS = (VOCAB_SIZE + 31) // 32
EOS = b"<|endoftext|>"
PRETOKEN = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")
CODE = ["()", "():", "):", "(self", "self.", "def ", "return ", "import ", "from ", "class ", "lambda ", "None",
        "True", "False", "__init__", "__name__", "->", "=>", "==", "!=", "<=", ">=", "+=", "**", "//", "...",
        "{\"", "\":", "\":\"", "\",\"", "\"}", "\"},", "\"]", "[\"", "\":[", "\":{", "},{", "}}", "]}", "null",
        "true", "false", "\\n", "\\\"", "\\\\", "\\u", "']", "['", "={", "};", "});", "();", "`", "```", "```json"]
TOOL_CALL = {  # an agent's function call
    "type": "object", "required": ["name", "arguments"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search_web", "run_python"]},
        "arguments": {
            "type": "object", "required": ["query", "limit", "unit", "tags", "location"], "additionalProperties": False,
            "properties": {
                "query": {"type": "string", "maxLength": 120},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 4},
                "location": {"type": "object", "required": ["city", "country"], "additionalProperties": False,
                             "properties": {"city": {"type": "string", "maxLength": 48},
                                            "country": {"type": "string", "maxLength": 2}}}}}}}
GRAMMARS = {"tool call": TOOL_CALL, "json object": {"type": "object"}}
PARTS = ("mask", "apply", "advance", "total")


def synthetic_vocab(size: int = VOCAB_SIZE, seed: int = 0) -> list[bytes]:
    """A byte-level-BPE-like vocabulary of `size` distinct tokens, EOS last (see the module docstring)."""
    from pydoc_data.topics import topics

    rng = random.Random(seed)
    text = "\n".join(topics[k] for k in sorted(topics))
    pieces = collections.Counter(PRETOKEN.findall(text))
    words = collections.Counter(re.findall(r"[A-Za-z]+", text))
    vocab = dict.fromkeys(bytes([b]) for b in range(256))

    def add(*strings: str) -> None:
        for s in strings:
            vocab.setdefault(s.encode(), None)

    add(*(p for p, _ in pieces.most_common()))
    add(*CODE)
    for word, _ in words.most_common():
        for form in dict.fromkeys((word, word.lower(), word.capitalize(), word.upper())):
            add(form, " " + form)
    for word, _ in words.most_common():  # sub-words
        for i in range(2, len(word)):
            add(word[:i], " " + word[:i], word[i:])
    add(*(f"{n}" for n in range(1000)), *(f" {n}" for n in range(1000)))
    for n in range(1, 33):
        add(" " * n, "\t" * min(n, 8), "\n" * min(n, 8), "\n" + " " * n, "\n\n" + " " * n, "\n" + "\t" * min(n, 8))
    letters = [chr(c) for r in ((0xC0, 0x180), (0x391, 0x3CA), (0x410, 0x450)) for c in range(*r)]
    add(*letters, *(" " + c for c in letters))
    add(*rng.sample([chr(c) for c in range(0x4E00, 0x9FA6)], 6000))
    heads, head_counts = zip(*pieces.most_common(4000))
    tails = [w[i:] for w, _ in words.most_common(2000) for i in range(1, len(w) - 1) if len(w) - i <= 5]
    while len(vocab) < size - 1:  # concatenations of a frequent piece and a short word ending
        for head, tail in zip(rng.choices(heads, head_counts, k=10_000), rng.choices(tails, k=10_000)):
            add(head + tail)
    tokens = list(vocab)[: size - 1]
    return tokens + [EOS]


def percentiles(us: list[float]) -> dict[str, float]:
    a = np.asarray(us)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


class Llguidance:
    def __init__(self, vocab: list[bytes]):
        import llguidance
        import llguidance.torch

        class RawVocab:  # what llguidance.TokenizerWrapper reads
            eos_token_id, bos_token_id, tokens, special_token_ids = len(vocab) - 1, None, vocab, [len(vocab) - 1]

            def __call__(self, s: bytes) -> list[int]:
                return list(s)  # single bytes; the probe never tokenizes text

        self.ll, self.torch = llguidance, llguidance.torch
        self.name, self.version = "llguidance", importlib.metadata.version("llguidance")
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(RawVocab()), n_vocab=len(vocab))
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher

    def new_matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, matchers: list, bitmask: torch.Tensor) -> None:
        if len(matchers) == 1:
            self.torch.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.torch.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.torch.apply_token_bitmask_inplace(logits, bitmask)

    def advance(self, matchers: list, tokens: list[int]) -> None:
        if len(matchers) == 1:
            ok = [matchers[0].consume_token(tokens[0])]
        else:
            ok = self.torch.consume_token_par(self.executor, list(zip(matchers, tokens)))
        if not all(ok):
            raise RuntimeError(f"llguidance refused a token: {[m.get_error() for m in matchers]}")


class Xgrammar:
    def __init__(self, vocab: list[bytes]):
        import xgrammar

        self.xgr, self.name, self.version = xgrammar, "xgrammar", importlib.metadata.version("xgrammar")
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=len(vocab),
                                      stop_token_ids=[len(vocab) - 1])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=True)
        self.batch = xgrammar.BatchGrammarMatcher()

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"),
                                                 strict_mode=False)

    def new_matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matchers: list, bitmask: torch.Tensor) -> None:
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=VOCAB_SIZE)

    def advance(self, matchers: list, tokens: list[int]) -> None:
        if len(matchers) == 1:
            ok = [matchers[0].accept_token(tokens[0])]
        else:
            ok = self.xgr.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
        if not all(ok):
            raise RuntimeError(f"xgrammar refused one of the tokens {tokens}")


def compile_costs(engine, schema: dict) -> tuple[object, dict[str, float]]:
    """The compiled grammar and its costs in milliseconds."""
    start = time.perf_counter()
    compiled = engine.compile(schema)
    cold = time.perf_counter()
    engine.compile(schema)
    repeat = time.perf_counter()
    matcher = engine.new_matcher(compiled)
    new = time.perf_counter()
    engine.fill([matcher], torch.zeros(1, MASK_WORDS, dtype=torch.int32))
    first = time.perf_counter()
    return compiled, {"cold_ms": (cold - start) * 1e3, "repeat_ms": (repeat - cold) * 1e3,
                      "new_matcher_ms": (new - repeat) * 1e3, "first_mask_ms": (first - new) * 1e3}


def walk(engine, compiled, batch: int, steps: int, device: torch.device, seed: int) -> dict:
    """`steps` decode steps of `batch` matchers drawing allowed tokens uniformly; microseconds per part."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rng = np.random.default_rng(seed)
    bitmask = torch.zeros(batch, MASK_WORDS, dtype=torch.int32, pin_memory=device.type == "cuda")
    logits = torch.randn(batch, VOCAB_SIZE, device=device)
    for _ in range(3):  # the apply kernels compile on first use (torch.compile / Triton)
        engine.apply(logits, bitmask.to(device))
    sync()
    matchers = [engine.new_matcher(compiled) for _ in range(batch)]
    times = {part: [] for part in PARTS}
    allowed_share, restarts = [], 0
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.fill(matchers, bitmask)
        t1 = time.perf_counter()
        engine.apply(logits, bitmask.to(device, non_blocking=True))
        sync()
        t2 = time.perf_counter()
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :VOCAB_SIZE]
        tokens = []
        for row in bits:
            allowed = np.flatnonzero(row)
            if allowed.size == 0:
                raise RuntimeError(f"{engine.name}: a mask allows no token")
            allowed_share.append(allowed.size / VOCAB_SIZE)
            tokens.append(int(allowed[rng.integers(allowed.size)]))
        t3 = time.perf_counter()
        engine.advance(matchers, tokens)
        t4 = time.perf_counter()
        for part, seconds in zip(PARTS, (t1 - t0, t2 - t1, t4 - t3, t2 - t0 + t4 - t3)):
            times[part].append(seconds * 1e6)
        for i, token in enumerate(tokens):
            if token == VOCAB_SIZE - 1:
                matchers[i], restarts = engine.new_matcher(compiled), restarts + 1
    return {"steps": steps, "restarts": restarts, "mean_allowed_share": float(np.mean(allowed_share)),
            "us_per_step": {part: percentiles(us) for part, us in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=256, help="decode steps per walk")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    start = time.perf_counter()
    vocab = synthetic_vocab(seed=args.seed)
    assert len(vocab) == len(set(vocab)) == VOCAB_SIZE
    print(f"synthetic vocabulary: {len(vocab)} tokens in {time.perf_counter() - start:.1f} s, "
          f"mean {np.mean([len(t) for t in vocab]):.1f} bytes", flush=True)
    record = {"asked": "2026-12-04", "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "cpu_count": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
              "tokens": args.tokens, "vocab": {"size": len(vocab), "eos_id": len(vocab) - 1,
                                               "sha256": hashlib.sha256(b"\0".join(vocab)).hexdigest()},
              "engines": {}}
    rows = []
    for make in (Llguidance, Xgrammar):
        start = time.perf_counter()
        engine = make(vocab)
        setup_s = time.perf_counter() - start
        print(f"{engine.name} {engine.version}: tokenizer set up in {setup_s:.2f} s", flush=True)
        entry = record["engines"][engine.name] = {"version": engine.version, "tokenizer_setup_s": setup_s,
                                                  "grammars": {}}
        for grammar, schema in GRAMMARS.items():
            compiled, costs = compile_costs(engine, schema)
            print(f"  {grammar}: compile cold {costs['cold_ms']:.1f} ms, repeat {costs['repeat_ms']:.2f} ms, "
                  f"new matcher {costs['new_matcher_ms']:.3f} ms, first mask {costs['first_mask_ms']:.2f} ms",
                  flush=True)
            walks = {}
            for batch in args.batches:
                walks[batch] = result = walk(engine, compiled, batch, args.tokens, device, args.seed)
                print(f"    B={batch}: total p50 {result['us_per_step']['total']['p50']:.0f} us a step", flush=True)
                rows.append((engine.name, grammar, batch, result))
            entry["grammars"][grammar] = {"compile": costs, "walks": walks}
    print(f"\nmicroseconds per decode step (B rows together), {args.tokens} steps, apply on {record['device']}")
    print(f"{'engine':10s} {'grammar':11s} {'B':>2s} {'allowed':>7s} {'restarts':>8s} " +
          " ".join(f"{part + ' p50/p90/p99/mean':>30s}" for part in PARTS))
    for name, grammar, batch, result in rows:
        cells = ["/".join(f"{v:.0f}" for v in result["us_per_step"][part].values()) for part in PARTS]
        print(f"{name:10s} {grammar:11s} {batch:2d} {result['mean_allowed_share']:7.1%} {result['restarts']:8d} " +
              " ".join(f"{c:>30s}" for c in cells))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
