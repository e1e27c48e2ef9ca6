"""Training runs for the claims: one ``experiments.train`` job each, read back as run files."""

from wagma.results import load_run, summarize

from ..jobs import clear_run, run_training
from .record import DIFFERS, IN_KIND, REPRODUCED

__all__ = ["direction_verdict", "ratio_verdict", "train", "train_time"]

#: A ratio claim is reproduced when ours is within this fraction of the paper's.
RATIO_TOLERANCE = 0.10


def train(ctx, name, ranks, algo, extra):
    """Run ``experiments.train`` into ``<claim folder>/NAME.h5`` (an earlier
    file of that name is removed first) and return the run."""
    out = ctx.path(f"{name}.h5")
    clear_run(out)
    run_training(ctx.mpiexec, ranks, algo, out, extra)
    return load_run(out)


def train_time(run):
    """Seconds on the training clock until the last rank ended its last step (evaluation excluded)."""
    return summarize(run)["train_time"]


def ratio_verdict(ours, paper, scale_note, noise=0.0):
    """The verdict of a speedup claim: reproduced within :data:`RATIO_TOLERANCE`
    of the paper's ratio, in kind when only its direction (above or below 1)
    holds, else differs; and the row's ``why``.  ``noise``: how far from 1 a
    ratio of ours can lie by chance (the relative spread of the times it
    divides, where measured over seeds); a ratio within it has no direction."""
    if abs(ours - 1) <= noise and (paper is None or abs(paper - 1) > noise):
        return DIFFERS, f"within {noise:.1%} of 1, the spread of the times over the seeds: no direction; {scale_note}"
    if paper is not None and ours > 0 and abs(ours / paper - 1) <= RATIO_TOLERANCE:
        return REPRODUCED, f"within {RATIO_TOLERANCE:.0%} of the paper's"
    if paper is not None and (ours > 1) == (paper > 1):
        return IN_KIND, f"same direction; {scale_note}"
    return DIFFERS, scale_note


def direction_verdict(holds, note, same_setting=False):
    """The verdict of a claim that states a direction or an ordering only:
    where it holds, reproduced in the paper's own setting (its model and
    constants, ``same_setting``), else reproduced in kind (our task and scale
    are not the paper's, so no figure of ours can equal the paper's);
    differs where it does not hold."""
    if not holds:
        return DIFFERS, note
    return (REPRODUCED if same_setting else IN_KIND), note
