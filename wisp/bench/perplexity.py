"""`wisp bench perplexity`: how well a model predicts a text, measured through wisp's own engine.

    wisp bench perplexity --model demo                        # the demo's held-out text (bits/byte)
    wisp bench perplexity --model PATH --text FILE --window 2047 --mode paged --expert-cap 4
    wisp bench perplexity --model demo --record-routing routing.npz --out perplexity.json

The text (a UTF-8 file, or `demo-held-out`: the demo's held-out Python documentation, `wisp.models.demo_text`) is
tokenized by the model's tokenizer and scored window by window (`wisp.models.text_scoring`: each window from
scratch, its first token unpredicted), each window one teacher-forced prefill (`LLM.prompt_logits`) in the chosen
mode; a window leaves room for one more token within the model's context. Prints and writes (`--out`) bits per
token, perplexity per token, and bits per byte: bits per token divided by the text's UTF-8 bytes per token, exact for
the demo's byte-level tokenizer and an estimate for others (a window's unpredicted first token still counts its bytes).

`--record-routing FILE` records every scored token's routed experts (`RoutingRecorder`) and saves them with each
token its own step and each window one sequence (`sequence_lengths`): within a window, the routing that one stream
decoding that window token by token meets (a token's routing is the prefill's, by wisp's chunking invariance), for
`wisp plan --trace` and `wisp sim`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from wisp.errors import WispError

DEMO_HELD_OUT = "demo-held-out"


def read_text(source: str) -> str:
    if source == DEMO_HELD_OUT:
        from wisp.models.demo_text import demo_text

        return demo_text("held-out")
    try:
        return Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WispError(f"--text {source}: no such file") from None
    except UnicodeDecodeError as exc:
        raise WispError(f"--text {source} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise WispError(f"--text {source}: {exc.strerror or exc}") from None


def bench_perplexity(args) -> int:
    from wisp.engine.llm import LLM
    from wisp.models.config_parsers import read_model_config
    from wisp.models.demo_text import SCORE_WINDOW
    from wisp.models.source import resolve_model_path
    from wisp.models.text_scoring import score, windows
    from wisp.trace.format import RoutingTrace
    from wisp.trace.recorder import check_trace_path, recorder_for, save_trace

    text = read_text(args.text)
    window = args.window or SCORE_WINDOW
    if window < 2:
        raise WispError(f"--window {window}: a window must hold at least 2 tokens (one to predict from)")
    if args.record_routing:
        check_trace_path(args.record_routing)
    context = read_model_config(resolve_model_path(args.model)).max_position_embeddings
    if window >= context:
        raise WispError(f"--window {window}: {args.model} holds {context} positions, and a window must leave room for "
                        f"one more token: use --window {context - 1} or less")
    llm = LLM(args.model, mode=args.mode, expert_cap=args.expert_cap, device=args.device, dtype=args.dtype,
              max_model_len=window + 1)  # room for the token a prompt must leave
    if llm.tokenizer is None:
        raise WispError(f"{args.model} has no tokenizer: perplexity needs one to read --text")
    ids = llm.tokenizer.encode(text)
    if len(ids) < 2:
        raise WispError(f"--text {args.text} gives {len(ids)} token(s): nothing to predict")
    cfg = llm.config
    recorder = recorder_for(llm.engine, args.model, args.record_routing) if args.record_routing else None

    def logits_of(chunk: list[int]):
        if recorder is not None:
            recorder.begin_step()
        return llm.prompt_logits(chunk)

    result = score(ids, logits_of, window)
    bytes_per_token = len(text.encode()) / len(ids)
    record = {
        "model": args.model, "text": args.text, "mode": args.mode, "expert_cap": llm.expert_cap, "window": window,
        "tokens": len(ids), "predicted_tokens": result.predicted,
        "bits_per_token": round(result.bits_per_token, 5),
        "perplexity": round(2 ** result.bits_per_token, 4),
        "bits_per_byte": round(result.bits_per_token / bytes_per_token, 5),
    }
    print(f"{args.model} on {args.text}: {record['bits_per_byte']:.4f} bits/byte, {record['bits_per_token']:.4f} "
          f"bits/token, perplexity {record['perplexity']:.3f} ({result.predicted} tokens predicted, windows of {window})")
    if recorder is not None:
        def per_token() -> RoutingTrace:
            recorded = recorder.trace()
            note = (f"routing of {args.model} over {args.text} ({len(ids)} tokens), recorded by `wisp bench "
                    f"perplexity` in windows of {window} (one sequence each); each token its own step")
            lengths = [end - start for start, end in windows(len(ids), window)]
            return RoutingTrace(recorded.ids, recorded.weights, None, recorded.layers, cfg.num_experts,
                                {"model": args.model, "note": note, "sequence_lengths": lengths})

        save_trace(per_token, args.record_routing)
        record["routing"] = str(args.record_routing)
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    if not math.isfinite(result.bits_per_token):
        print("wisp: the model gave a non-finite log-probability", file=sys.stderr)
        return 1
    return 0
