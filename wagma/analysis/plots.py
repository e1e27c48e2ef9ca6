"""Figures of a set of runs: throughput against P, accuracy against time, who waited when."""

import math
import os
import warnings

import numpy as np

from wagma.results import Run

from .table import mean_throughput, run_label

__all__ = ["plot_accuracy", "plot_all", "plot_throughput", "plot_waits"]

_MAX_COLUMNS = 2000  # steps shown per rank in a wait image (longer runs are binned)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panel(ax, title, xlabel, ylabel):
    """Title, axis labels, a light grid and the legend of one panel."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def _save(plt, fig, title, path):
    """Give ``fig`` its title, write it to ``path`` and free it; returns ``path``."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _grid(plt, count, width=5.5, height=4.0, **options):
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False, **options)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def plot_throughput(rows: list[dict], path: str) -> str | None:
    """Throughput against P, one line per algorithm variant (the rows'
    ``label``: ``sgp (1n)`` and ``sgp (2n)`` are two lines; repeated runs:
    their :func:`~wagma.analysis.table.mean_throughput`), one panel per
    (imbalance, compute) - as WAGMA-SGD's Figure 4.

    ``rows`` are :func:`~wagma.analysis.table.compare`'s.  Returns ``path``,
    or None (nothing written) when no row has a throughput.
    """
    rows = [r for r in rows if r["throughput"] is not None]
    if not rows:
        return None
    plt = _pyplot()
    panels = sorted({(r["imbalance"], r["compute"]) for r in rows}, key=lambda k: (k[0] != "none", k))
    several = len({(r["model"], r["dataset"]) for r in rows}) > 1
    lines = sorted({(r["label"], r["model"], r["dataset"]) for r in rows})
    colors = {line: f"C{i % 10}" for i, line in enumerate(lines)}  # the same in every panel
    fig, axes = _grid(plt, len(panels))
    for ax, (imbalance, compute) in zip(axes, panels):
        mine = [r for r in rows if (r["imbalance"], r["compute"]) == (imbalance, compute)]
        for line in sorted({(r["label"], r["model"], r["dataset"]) for r in mine}):
            points = [r for r in mine if (r["label"], r["model"], r["dataset"]) == line]
            ranks = sorted({r["ranks"] for r in points})
            mean = [mean_throughput([r for r in points if r["ranks"] == p]) for p in ranks]
            label = f"{line[0]} ({line[1]}, {line[2]})" if several else line[0]
            ax.plot(ranks, mean, marker="o", color=colors[line], label=label)
        ranks = sorted({r["ranks"] for r in mine})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(p) for p in ranks])
        _panel(ax, f"imbalance {imbalance}, {compute} compute", "processes P", "throughput (samples/s)")
    return _save(plt, fig, "Training throughput against the number of processes", path)


def _variant_labels(runs: list[Run]) -> dict:
    """``{id(run): label}``: :func:`~wagma.analysis.table.run_label`, and
    where runs of one label differ in tau or S (local SGD with period 1 and
    10 in one job), the value of each, so that they get lines of their own."""
    labels = {id(run): run_label(run) for run in runs}
    for name in set(labels.values()):
        same = [run for run in runs if labels[id(run)] == name]
        for attribute, word in (("tau", "tau"), ("group_size", "S")):
            if len({str(run.attrs.get(attribute)) for run in same}) > 1:
                for run in same:
                    labels[id(run)] += f", {word} {run.attrs.get(attribute)}"
    return labels


def plot_accuracy(runs: list[Run], path: str, target_accuracy: float | None = None) -> str | None:
    """Accuracy of the averaged model against training-clock time, one line
    per run, a colour per algorithm variant
    (:func:`~wagma.analysis.table.run_label`), one panel per (P, dataset) -
    as WAGMA-SGD's Figure 5.

    Only runs with evaluations are drawn; returns ``path``, or None (nothing
    written) when no run has one.
    """
    runs = [r for r in runs if np.any(np.isfinite(np.asarray(r.eval.get("accuracy", ()), dtype=float)))]
    if not runs:
        return None
    plt = _pyplot()

    def key(run):
        return int(run.attrs.get("ranks", 0)), str(run.attrs.get("dataset", "?"))

    panels = sorted({key(run) for run in runs})
    labels = _variant_labels(runs)
    colors = {name: f"C{i % 10}" for i, name in enumerate(sorted(set(labels.values())))}  # the same in every panel
    fig, axes = _grid(plt, len(panels))
    for ax, panel in zip(axes, panels):
        mine = sorted((r for r in runs if key(r) == panel), key=lambda r: (labels[id(r)], r.path))
        names = [labels[id(run)] for run in mine]
        for run, name in zip(mine, names):
            label = f"{name}, P={panel[0]}"
            if names.count(name) > 1:
                label += f" ({os.path.basename(run.path)})"
            ax.plot(
                run.eval["clock"],
                100 * np.asarray(run.eval["accuracy"], dtype=float),
                marker=".",
                color=colors[name],
                label=label,
            )
        if target_accuracy is not None:
            ax.axhline(
                100 * target_accuracy,
                color="gray",
                linestyle=":",
                linewidth=1,
                label=f"target {100 * target_accuracy:g}%",
            )
        _panel(ax, f"{panel[1]}, P={panel[0]}", "training time (s)", "accuracy of the averaged model (%)")
    return _save(plt, fig, "Accuracy against training time", path)


def _binned(values: np.ndarray, columns: int) -> tuple[np.ndarray, int]:
    """``values`` ``[rank, step]`` averaged over bins of steps so that at
    most ``columns`` remain; also the number of steps per bin."""
    steps = values.shape[1]
    width = max(1, math.ceil(steps / columns))
    if width == 1:
        return values, 1
    padded = np.full((values.shape[0], math.ceil(steps / width) * width), np.nan)
    padded[:, :steps] = values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a bin of NaN only stays NaN
        return np.nanmean(padded.reshape(values.shape[0], -1, width), axis=2), width


def plot_waits(run: Run, path: str) -> str | None:
    """Who waited when: wait time per rank and step as an image, and below
    it every rank's cumulative wait time against the step.

    Returns ``path``, or None (nothing written) for a run without steps.
    """
    wait = 1000 * np.asarray(run.steps["wait_time"], dtype=float)
    ranks, steps = wait.shape
    if not steps:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    image, width = _binned(wait, _MAX_COLUMNS)
    fig = plt.figure(figsize=(10, 7))
    grid = fig.add_gridspec(2, 2, width_ratios=(40, 1))
    top = fig.add_subplot(grid[0, 0])
    bottom = fig.add_subplot(grid[1, 0], sharex=top)
    peak = float(np.nanmax(image)) if np.any(image > 0) else 1.0
    shown = top.imshow(
        image,
        aspect="auto",
        interpolation="nearest",
        origin="lower",
        cmap="viridis",
        vmin=0,
        vmax=peak,
        extent=(-0.5 * width, (image.shape[1] - 0.5) * width, -0.5, ranks - 0.5),
    )
    fig.colorbar(
        shown,
        cax=fig.add_subplot(grid[0, 1]),
        label="wait time (ms)" + (f", mean of {width} steps" if width > 1 else ""),
    )
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_ylabel("rank")
    top.set_title("wait time per rank and step")
    total = np.nancumsum(wait, axis=1) / 1000
    for rank in range(ranks):
        bottom.plot(np.arange(steps), total[rank], linewidth=1, label=f"rank {rank}")
    if ranks <= 16:
        bottom.legend(fontsize="x-small", ncol=2)
    bottom.set_xlabel("step")
    bottom.set_ylabel("cumulative wait time (s)")
    bottom.set_title("cumulative wait time per rank")
    bottom.grid(True, alpha=0.3)
    attrs = run.attrs
    return _save(
        plt,
        fig,
        f"{run_label(run)}, P={ranks}, imbalance {attrs.get('imbalance', '?')}: {os.path.basename(run.path)}",
        path,
    )


def plot_all(runs: list[Run], rows: list[dict], folder: str, target_accuracy: float | None = None) -> list[str]:
    """Every figure into ``folder`` (created): ``throughput.png``,
    ``accuracy_vs_time.png`` (if any run has evaluations) and one
    ``waits_<file stem>.png`` per run with steps; returns the paths written."""
    os.makedirs(folder, exist_ok=True)
    written = [
        plot_throughput(rows, os.path.join(folder, "throughput.png")),
        plot_accuracy(runs, os.path.join(folder, "accuracy_vs_time.png"), target_accuracy),
    ]
    names = set()
    for run in runs:
        stem = os.path.basename(run.path)[:-3] if run.path.endswith(".h5") else os.path.basename(run.path)
        name, n = f"waits_{stem}.png", 1
        while name in names:
            n += 1
            name = f"waits_{stem}_{n}.png"
        names.add(name)
        written.append(plot_waits(run, os.path.join(folder, name)))
    return [p for p in written if p]
