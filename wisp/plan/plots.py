"""The PNG of `wisp plan --plot`: both miss curves and the predicted latency by expert fraction.

matplotlib is optional: `pyplot` raises a WispError saying how to install it, and only when a plot is
asked for (`wisp sim --plot`, wisp/sim/plots.py, uses it too). Plots are written with the file-only Agg
backend.
"""

from __future__ import annotations

from pathlib import Path

from wisp.errors import WispError
from wisp.plan.plan import Plan
from wisp.plan.split import latency


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or a WispError saying how to get it (--plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WispError("--plot needs matplotlib: pip install matplotlib") from None
    return plt


def latency_by_cap(plan: Plan) -> tuple[list[int], list[float], list[float]]:
    """Every cap that fits the pageable budget (floor or not), its expert fraction of the budget, and
    the predicted latency per request there."""
    p = plan.curves.problem
    exp, kv = plan.curves.arrays()
    caps = list(p.feasible_caps(floor=False))
    lat = [latency(p, exp, kv, c).latency for c in caps]
    fractions = [c * p.slot_bytes / p.budget_bytes for c in caps]
    return caps, fractions, lat


def plot_plan(plan: Plan, path: str | Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    _plot_expert_curve(ax[0], plan)
    _plot_kv_curve(ax[1], plan)
    _plot_latency(ax[2], plan)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_expert_curve(ax, plan: Plan) -> None:
    exp, cap = plan.curves.expert, plan.report.expert_cap
    ax.plot(range(len(exp)), exp)
    ax.axvline(cap, color="C3", ls="--", label=f"{cap} slots")
    ax.set(xlabel="expert slots per layer", ylabel="expert misses per token", title="expert miss curve (LRU, exact)")
    ax.legend()


def _plot_kv_curve(ax, plan: Plan) -> None:
    kv = plan.curves.kv
    ax.plot(range(len(kv)), kv)
    ax.axvline(plan.kv_blocks, color="C3", ls="--", label=f"{plan.kv_blocks} KV blocks")
    ax.axvline(plan.report.admission_floor_blocks, color="k", ls=":", label="admission floor")
    ax.set(xlabel="KV blocks", ylabel="block misses per request", title="KV miss curve (prefix cache, exact)")
    ax.legend()


def _plot_latency(ax, plan: Plan) -> None:
    report = plan.report
    _, fractions, lat = latency_by_cap(plan)
    ax.plot(fractions, lat)
    ax.axvline(report.expert_bytes / report.pageable_bytes, color="C3", ls="--", label="chosen fraction")
    floor_fraction = 1 - report.admission_floor_blocks * report.block_bytes / report.pageable_bytes
    ax.axvspan(floor_fraction, max(fractions + [floor_fraction]), color="0.85", label="below the KV floor")
    ax.set(xlabel="expert fraction of the pageable budget", ylabel="predicted latency per request (s)",
           title="predicted latency by expert fraction")
    ax.legend()
