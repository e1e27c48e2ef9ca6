"""Figures of StragglAR schedules and of the cost model (matplotlib, PNG)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Imported at run time (the package has imported it already) so that the annotations
# resolve: the reference then names the Schedule of this package, not wagma.emulate's.
from .schedule import Schedule

__all__ = ["plot_schedule", "plot_speedup", "schedule_grid"]


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend, imported on first use
    (it is slow to import and only the plotting commands need it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def schedule_grid(schedule: Schedule) -> np.ndarray:
    """[round, rank] -> the chunk the rank receives in that round, -1 for none.

    Reductions (the straggler's exchanges) and copies are told apart by
    :func:`plot_schedule`; this grid only says who gets which chunk when.
    """
    grid = np.full((len(schedule.rounds), schedule.n), -1, dtype=int)
    for r, transfers in enumerate(schedule.rounds):
        for t in transfers:
            grid[r, t.dst] = t.chunk
    return grid


def plot_schedule(schedule: Schedule, path: str) -> None:
    """Rounds by ranks, like Figure 4a of the StragglAR paper: each cell
    shows the chunk a rank receives in a round and from whom; hatched cells
    are the exchanges with the straggler (reductions)."""
    plt = _pyplot()
    grid = schedule_grid(schedule)
    rounds, n = grid.shape
    fig, ax = plt.subplots(figsize=(max(4, 0.55 * n + 1.5), max(3, 0.4 * rounds + 1.2)))
    shown = np.ma.masked_less(grid, 0)
    ax.imshow(shown, cmap="tab20", vmin=0, vmax=max(schedule.num_chunks - 1, 1), aspect="auto", interpolation="nearest")
    if n <= 32:
        for r, transfers in enumerate(schedule.rounds):
            for t in transfers:
                ax.text(
                    t.dst, r, f"c{t.chunk}\n{'+' if t.reduce else '<'}{t.src}", ha="center", va="center", fontsize=7
                )
                if t.reduce:
                    ax.add_patch(plt.Rectangle((t.dst - 0.5, r - 0.5), 1, 1, fill=False, hatch="//", linewidth=0))
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"{k}{'*' if k == schedule.straggler else ''}" for k in range(n)])
    ax.set_xlabel("rank (* straggler)")
    ax.set_ylabel("round")
    ax.set_title(f"StragglAR, n = {n}: {rounds} rounds (cell: chunk received; +src reduce, <src copy)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speedup(ns: Sequence[int], speedups: Mapping[str, Sequence[float]], path: str, title: str) -> None:
    """Speedup of StragglAR over each baseline against n (Figure 6b)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, values in speedups.items():
        ax.plot(ns, values, marker=".", label=f"over {name}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks n")
    ax.set_ylabel("StragglAR speedup (alpha-beta model)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
