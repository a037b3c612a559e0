"""The PNG of `wisp bench serve --plot`: aggregate decode tok/s and p99 inter-token latency against the load
(W for closed-loop runs, else the request rate), one line per load control setting.

matplotlib is optional, as for `wisp plan --plot` (`wisp.plan.plots.pyplot`: a WispError saying how to get it).
"""

from __future__ import annotations

from pathlib import Path

from wisp.plan.plots import pyplot


def plot_runs(records: list[dict], path: str | Path) -> None:
    closed = [r for r in records if r["concurrency"] is not None]
    runs, x_key, x_label = (closed, "concurrency", "concurrent requests (W)") if closed else (
        records, "request_rate", "request rate (requests/s)")
    plt = pyplot()
    fig, (speed, itl) = plt.subplots(1, 2, figsize=(10, 4))
    for setting in dict.fromkeys(r["load_control"] for r in runs):
        mine = sorted((r for r in runs if r["load_control"] == setting), key=lambda r: r[x_key])
        x = [r[x_key] for r in mine]
        label = f"load control {setting}" if setting else "server"
        speed.plot(x, [r["decode_tok_s"] for r in mine], marker="o", label=label)
        itl.plot(x, [None if r["itl_p99_s"] is None else r["itl_p99_s"] * 1e3 for r in mine], marker="o", label=label)
    speed.set(xlabel=x_label, ylabel="output tokens/s (all requests)", title="aggregate decode speed")
    itl.set(xlabel=x_label, ylabel="ms", title="inter-token latency p99")
    for ax in (speed, itl):
        ax.set_xticks(sorted({r[x_key] for r in runs}))
        ax.legend()
        ax.grid(alpha=0.3)
    first = records[0]
    fig.suptitle(f"{first['model']} {first['mode'] or 'served'}, prompt {first['prompt_len']}, "
                 f"output {first['output_len']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
