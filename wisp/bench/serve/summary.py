"""What one `wisp bench serve` run measured, as a flat record, and the table printed for a list of them.

Timing fields (seconds): `decode_tok_s` is every output token over `wall_s`, the run's wall from the first
request's start to the last token; TTFT (start -> first token), ITL (gaps between a request's consecutive
tokens, `itl_count` of them) and end-to-end latency (start -> last token) each as p50/p90/p99 and mean, None
when there are none. Engine fields: the decode width histogram (`decode_width`: width -> steps, JSON keys are
strings), the expert counters of the run and what load control reported (`load_control_state`, None without).
"""

from __future__ import annotations

from wisp.bench.percentiles import percentile
from wisp.bench.serve.request_times import RequestTimes

QUANTILES = (50, 90, 99)
DIGITS = 6  # a microsecond


def spread(name: str, values: list[float]) -> dict:
    """{name}_p50_s, _p90_s, _p99_s and _mean_s of `values` (None each when there are none)."""
    out = {f"{name}_p{q}_s": percentile(values, q, DIGITS) if values else None for q in QUANTILES}
    out[f"{name}_mean_s"] = round(sum(values) / len(values), DIGITS) if values else None
    return out


def timing_fields(requests: list[RequestTimes], wall_s: float) -> dict:
    tokens = sum(r.output_tokens for r in requests)
    itl = [gap for r in requests for gap in r.gaps]
    return {"requests": len(requests), "output_tokens": tokens, "wall_s": round(wall_s, DIGITS),
            "decode_tok_s": round(tokens / wall_s, 3) if wall_s > 0 else None,
            **spread("ttft", [r.ttft for r in requests if r.ttft is not None]),
            **spread("itl", itl), "itl_count": len(itl),
            **spread("e2e", [r.e2e for r in requests if r.e2e is not None])}


def width_fields(widths: dict[int, int] | None, steps: int | None) -> dict:
    """The decode width chosen over the run: steps per number of requests decoded in the step (None each when
    the steps were not seen: over HTTP)."""
    if widths is None:
        return dict.fromkeys(("steps", "decode_steps", "decode_tokens", "decode_width_mean", "decode_width"))
    decode_steps = sum(widths.values())
    decode_tokens = sum(w * n for w, n in widths.items())
    return {"steps": steps, "decode_steps": decode_steps, "decode_tokens": decode_tokens,
            "decode_width_mean": round(decode_tokens / decode_steps, 3) if decode_steps else None,
            "decode_width": {str(w): widths[w] for w in sorted(widths)}}


def engine_fields(stats: dict) -> dict:
    """The run's expert traffic, preemptions and load control state from `LLMEngine.stats()` (counters reset
    at the run's start)."""
    tokens = stats["tokens_decoded"] + stats["tokens_prefilled"]
    return {"expert_hits": stats["expert_hits"], "expert_misses": stats["expert_misses"],
            "hit_rate": round(stats["hit_rate"], 4), "bytes_h2d": stats["bytes_h2d"],
            "bytes_h2d_per_token": round(stats["bytes_h2d"] / tokens) if tokens else None,
            "preemptions": stats["preemptions"], "load_control_state": stats.get("load_control")}


def _cell(value, scale: float = 1.0, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value * scale, fmt)


def print_table(records: list[dict]) -> None:
    print(f"{'lc':>4} {'W':>3} {'rate':>6} {'reqs':>5} {'tok/s':>8} {'TTFT p50':>9} {'ITL p50':>8} {'p90':>7} "
          f"{'p99':>7} {'e2e p50':>8} {'wall s':>7} {'width':>6} {'hit':>6} {'MB h2d':>8} {'preempt':>7}")
    for r in records:
        print(f"{r['load_control'] or '-':>4} {r['concurrency'] or '-':>3} {_cell(r['request_rate'], fmt='.2f'):>6} "
              f"{r['requests']:>5} {_cell(r['decode_tok_s']):>8} {_cell(r['ttft_p50_s'], 1e3):>9} "
              f"{_cell(r['itl_p50_s'], 1e3):>8} {_cell(r['itl_p90_s'], 1e3):>7} {_cell(r['itl_p99_s'], 1e3):>7} "
              f"{_cell(r['e2e_p50_s'], 1e3):>8} {r['wall_s']:>7.2f} {_cell(r.get('decode_width_mean'), fmt='.2f'):>6} "
              f"{_cell(r.get('hit_rate'), fmt='.3f'):>6} {_cell(r.get('bytes_h2d'), 1e-6):>8} "
              f"{_cell(r.get('preemptions'), fmt='.0f'):>7}")
    print("times in ms; width: mean requests decoded per decode step; lc: load control")
