"""The report's figures, with the papers' axes and units."""

import textwrap

import numpy as np

__all__ = ["accuracy_figure", "speedup_figure", "throughput_figure"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, ax, title, path):
    ax.set_title(textwrap.fill(title, 72), fontsize="medium")  # two lines rather than cut off
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_figure(throughput, path, title, ylabel="Throughput (images/s)"):
    """WAGMA Figures 4 and 10: throughput against the number of processes
    (the paper's GPU nodes), one line per algorithm; ``throughput`` maps a
    label to ``{P: samples/s}``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ranks = sorted({p for points in throughput.values() for p in points})
    for label, points in throughput.items():
        ps = sorted(points)
        ax.plot(ps, [points[p] for p in ps], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(p) for p in ranks])
    ax.set_xlabel("Number of processes (GPU nodes in the paper)")
    ax.set_ylabel(ylabel)
    return _save(plt, fig, ax, title, path)


def accuracy_figure(runs, path, title):
    """WAGMA Figure 5: top-1 test accuracy against training time in minutes,
    one line per run; ``runs`` maps a label to a run (its evaluations)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, run in runs.items():
        ax.plot(
            np.asarray(run.eval["clock"]) / 60,
            100 * np.asarray(run.eval["accuracy"], dtype=float),
            marker=".",
            label=label,
        )
    ax.set_xlabel("Training time (minutes)")
    ax.set_ylabel("Top-1 test accuracy (%)")
    return _save(plt, fig, ax, title, path)


def speedup_figure(ns, speedups, path, title):
    """StragglAR Figure 6(b): speedup over Ring against the number of GPUs;
    ``speedups`` maps a label to one speedup per ``ns``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, values in speedups.items():
        ax.plot(ns, values, marker="o", label=label)
    ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("Number of GPUs (n)")
    ax.set_ylabel("Speedup over Ring")
    return _save(plt, fig, ax, title, path)
