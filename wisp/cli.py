"""The `wisp` command line: `wisp generate ...`.

Bad input is one line on stderr and exit status 2, never a traceback: argparse errors and every
`WispError` raised below go through `fail`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from wisp.config import DTYPES, MODES
from wisp.errors import WispError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message}")


def fail(message: str) -> NoReturn:
    # one line, whatever the message holds (hub and safetensors errors can span several)
    message = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"wisp: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    return ids


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wisp", description="Serve MoE models on GPUs too small to hold them.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate from one prompt")
    gen.add_argument("--model", required=True, help="checkpoint directory, or 'demo' for the built-in tiny MoE")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-ids", type=_token_ids, help="prompt as comma-separated token ids")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--mode", choices=MODES, default="paged")
    gen.add_argument("--expert-cap", type=int, default=None, help="scratch slots per MoE layer (paged mode)")
    gen.add_argument("--device", default="auto", help="auto, cpu or cuda")
    gen.add_argument("--dtype", choices=["auto", *DTYPES], default="auto")
    gen.add_argument("--json", action="store_true", help="print one JSON object with tokens, text and stats")
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from wisp import LLM, SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    llm = LLM(args.model, device=args.device, mode=args.mode, expert_cap=args.expert_cap, dtype=args.dtype)
    out = llm.generate([args.prompt if args.prompt is not None else args.prompt_ids], params)[0]
    stats = llm.stats()
    if args.json:
        print(json.dumps({"token_ids": out.token_ids, "text": out.text, "finish_reason": out.finish_reason, "stats": stats}))
    else:
        print(out.text if llm.tokenizer is not None else " ".join(map(str, out.token_ids)))
        print(
            f"[{stats['mode']} cap={stats['expert_cap']}] hits={stats['expert_hits']} misses={stats['expert_misses']} "
            f"hit_rate={stats['hit_rate']:.2f} h2d={stats['bytes_h2d'] / 2**20:.1f} MiB",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": cmd_generate}[args.command](args)
    except WispError as exc:
        fail(str(exc))


if __name__ == "__main__":
    raise SystemExit(main())
