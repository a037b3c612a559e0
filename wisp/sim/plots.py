"""The PNG of `wisp sim --plot`: hit rate by capacity, one line per replacement policy.

matplotlib is optional, as for `wisp plan --plot` (`wisp.plan.plots.pyplot`: a WispError saying how to
install it, only when a plot is asked for; the file-only Agg backend).
"""

from __future__ import annotations

from pathlib import Path

from wisp.plan.plots import pyplot
from wisp.sim.policies import OUT_OF_DOMAIN


def plot_policies(caps: list[int], table: dict[str, list[int]], refs: int, path: str | Path) -> None:
    """Hit rate (1 - misses / references) against capacity, one line per policy; OUT_OF_DOMAIN cells left out."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for p, misses in table.items():
        pts = [(c, 1 - m / refs) for c, m in zip(caps, misses) if m != OUT_OF_DOMAIN]
        ax.plot([c for c, _ in pts], [h for _, h in pts], marker="o", label=p)
    ax.set(xlabel="expert slots per layer", ylabel="hit rate", title="expert cache policies on the trace")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
