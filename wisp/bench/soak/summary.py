"""A soak's report: what happened (outcomes, resizes, probes, memory) and which checks passed."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict


def report(cfg, server, startup_s, load_s, traffic, probes, resizes, rss, idle, final, health, exit_code) -> dict:
    """Everything the soak saw, as one JSON-able dict, and `passed`: each check by name."""
    tally = traffic.tally
    by_outcome: Counter = Counter()
    for (kind, outcome), n in tally.outcomes.items():
        by_outcome[outcome] += n
    texts = {(p.get("text"), p.get("completion_tokens")) for p in probes}
    probes_identical = len(texts) == 1 and all("error" not in p for p in probes)
    leak = None
    if idle is not None:
        leak = {k: int(idle.get(k, -1)) for k in ("wisp_kv_blocks_used", "wisp_requests_running",
                                                   "wisp_requests_waiting", "wisp_kv_blocks_cached",
                                                   "wisp_kv_blocks_free", "wisp_kv_blocks_capacity")}
        leak["blocks_accounted"] = (leak["wisp_kv_blocks_used"] + leak["wisp_kv_blocks_cached"]
                                    + leak["wisp_kv_blocks_free"] == leak["wisp_kv_blocks_capacity"])
    rss_summary = score_rss(rss, load_s, cfg.warmup_fraction)
    resize_ok = sum(1 for r in resizes if r.get("status") == 200)
    stalls = [r["answer"]["stall_s"] for r in resizes if r.get("status") == 200]
    finished = {k: v for k, v in final.items() if k.startswith("wisp_requests_finished_total")}
    five_xx = sum(n for s, n in tally.statuses.items() if s >= 500)
    result = {
        "config": {**asdict(cfg), "max_tokens": list(cfg.max_tokens)},
        "server_command": " ".join(server.command), "server_log": str(server.log_path),
        "startup_s": round(startup_s, 2), "load_s": round(load_s, 2), "requests": tally.sent,
        "requests_per_s": round(tally.sent / load_s, 2) if load_s else None,
        "by_outcome": dict(by_outcome),
        "by_kind_and_outcome": {f"{k}/{o}": n for (k, o), n in sorted(tally.outcomes.items())},
        "by_status": {str(s): n for s, n in sorted(tally.statuses.items(), key=lambda x: str(x[0]))},
        "five_xx": five_xx, "server_errors": tally.server_errors[:50], "unexpected": tally.unexpected,
        "resizes": {"asked": len(resizes), "applied": resize_ok,
                    "stall_s_max": max(stalls) if stalls else None,
                    "stall_s_median": statistics.median(stalls) if stalls else None, "log": resizes},
        "probes": probes, "probes_identical": probes_identical,
        "idle_metrics": leak, "finished_by_reason": finished,
        "tokens": {"prompt": final.get("wisp_prompt_tokens_total"), "generated": final.get("wisp_generation_tokens_total")},
        "health_after": health, "exit_code": exit_code,
        "rss": rss_summary, "rss_samples": rss,
    }
    unexpected = sum(n for o, n in by_outcome.items() if o.startswith("unexpected"))
    result["passed"] = {
        "no_5xx": five_xx == 0,
        "no_unexpected_outcome": unexpected == 0,
        "no_leak": bool(leak) and leak["wisp_kv_blocks_used"] == 0 and leak["wisp_requests_running"] == 0
        and leak["wisp_requests_waiting"] == 0 and leak["blocks_accounted"],
        "probes_identical": probes_identical,
        "resizes_applied": resize_ok > 0 or cfg.resize_every >= load_s,
        "rss_flat": bool(rss_summary and rss_summary.get("flat_within_10pct")),
        "clean_exit": exit_code == 0 and health == 200,
    }
    return result


def score_rss(rss: list[tuple[float, int]], load_s: float, warmup_fraction: float = 0.2) -> dict | None:
    """RSS over the run. After the warm-up (`warmup_fraction` of the run, 20-120 s): `growth`, the peak
    against the median of the first minute after it (a leak raises it: flat means <= 10%); `drift`, the last
    tenth's median against the first tenth's; `spread`, (max - min) / min, which also counts the dips when
    the allocator hands memory back (reported, not judged)."""
    if not rss:
        return None
    warmup = min(120.0, max(20.0, warmup_fraction * load_s))
    out = {"warmup_s": warmup, "first_mib": rss[0][1] / 2**20, "last_mib": rss[-1][1] / 2**20,
           "peak_mib": max(v for _, v in rss) / 2**20, "samples": len(rss)}
    after = [(t, v) for t, v in rss if t >= warmup]
    if len(after) < 2:
        return out
    values = [v for _, v in after]
    lo, hi = min(values), max(values)
    base = statistics.median([v for t, v in after if t < warmup + 60])
    tenth = max(1, len(values) // 10)
    out.update(after_warmup_min_mib=lo / 2**20, after_warmup_max_mib=hi / 2**20,
               after_warmup_base_mib=base / 2**20, after_warmup_growth=hi / base - 1,
               after_warmup_drift=statistics.median(values[-tenth:]) / statistics.median(values[:tenth]) - 1,
               after_warmup_spread=(hi - lo) / lo, flat_within_10pct=hi / base - 1 <= 0.10)
    return out


def summary(r: dict) -> str:
    rss = r["rss"] or {}
    lines = [
        f"soak: {r['requests']} requests in {r['load_s']:.0f} s ({r['requests_per_s']} req/s), server start {r['startup_s']} s",
        "  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(r["by_outcome"].items())),
        "  statuses: " + ", ".join(f"{k}: {v}" for k, v in r["by_status"].items()),
        f"  5xx: {r['five_xx']}",
        f"  resizes: {r['resizes']['applied']}/{r['resizes']['asked']} applied, stall max {r['resizes']['stall_s_max']} s",
        f"  idle after: {r['idle_metrics']}",
        f"  probes: {len(r['probes'])} ({Counter(p['phase'] for p in r['probes'])}), identical: {r['probes_identical']}",
        f"  rss: first {rss.get('first_mib', 0):.1f} MiB, after warm-up ({rss.get('warmup_s', 0):.0f} s) "
        f"{rss.get('after_warmup_min_mib', 0):.1f}-{rss.get('after_warmup_max_mib', 0):.1f} MiB, first minute "
        f"{rss.get('after_warmup_base_mib', 0):.1f}: growth {100 * rss.get('after_warmup_growth', 0):+.1f}%, drift "
        f"{100 * rss.get('after_warmup_drift', 0):+.1f}%, spread {100 * rss.get('after_warmup_spread', 0):.1f}%; "
        f"last {rss.get('last_mib', 0):.1f} MiB",
        f"  exit code {r['exit_code']}, /health after {r['health_after']}",
        "  passed: " + ", ".join(f"{k}={v}" for k, v in r["passed"].items()),
    ]
    return "\n".join(lines)
