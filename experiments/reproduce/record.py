"""A claim's measured rows in an HDF5 file, and the rows read back: what the report is made from."""

import dataclasses
import datetime
import math
import os

import h5py
import numpy as np

__all__ = ["DIFFERS", "IN_KIND", "REPRODUCED", "ClaimResult", "Row", "read_claim", "write_claim"]

#: Verdicts.  ``IN_KIND``: the direction or ordering the paper reports holds,
#: at a scale (ranks, model, network) that cannot give the paper's magnitude;
#: the row's ``why`` says which.
REPRODUCED, IN_KIND, DIFFERS = "reproduced", "reproduced in kind", "differs"


@dataclasses.dataclass
class Row:
    """One claim of a paper set beside our measurement.

    Args:
        claim: what the paper says, in a phrase.
        paper: the paper's figure, as the paper writes it (or "-" where it
            states a direction only).
        ours: our figure, NaN for a row that compares text (groups, orderings).
        fmt: how ``ours`` is written in the report (``str.format``).
        ours_text: the row's text where ``ours`` is NaN.
        verdict: one of ``REPRODUCED``, ``IN_KIND``, ``DIFFERS``.
        why: the criterion the verdict applies and, where it differs, the reason.
    """

    claim: str
    paper: str
    ours: float = math.nan
    fmt: str = "{:.2f}"
    ours_text: str = ""
    verdict: str = ""
    why: str = ""

    def __post_init__(self):
        if self.verdict not in (REPRODUCED, IN_KIND, DIFFERS):
            raise ValueError(
                f"verdict must be one of {REPRODUCED!r}, {IN_KIND!r}, {DIFFERS!r}, "
                f"got {self.verdict!r} (row {self.claim!r})"
            )

    @property
    def shown(self) -> str:
        """Our figure as the report writes it."""
        return self.fmt.format(self.ours) if math.isfinite(self.ours) else self.ours_text


@dataclasses.dataclass
class ClaimResult:
    """What one claim's run measured.

    Args:
        setting: how it was measured (ranks, cores, model, imbalance...), one paragraph.
        rows: the claim rows.
        figures: figure files, relative to the claim's folder.
        sources: the run and benchmark files the rows were computed from,
            relative to the claim's folder.
    """

    setting: str
    rows: list
    figures: list = dataclasses.field(default_factory=list)
    sources: list = dataclasses.field(default_factory=list)


_ROW_FIELDS = [f.name for f in dataclasses.fields(Row)]


def write_claim(path, name, title, paper, result, seconds, full):
    """``result`` of claim ``name`` into the HDF5 file ``path`` (replaced):
    file attributes for the claim, one group ``rows/NNN`` per row with the
    row's fields as attributes."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs.update(
            name=name,
            title=title,
            paper=paper,
            setting=result.setting,
            seconds=float(seconds),
            full=bool(full),
            cores=os.cpu_count() or 0,
            finished=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            figures=np.array(result.figures, dtype="S"),
            sources=np.array(result.sources, dtype="S"),
        )
        rows = f.create_group("rows")
        for i, row in enumerate(result.rows):
            rows.create_group(f"{i:03d}").attrs.update(dataclasses.asdict(row))
    return path


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def read_claim(path) -> dict:
    """The claim file ``path``: its attributes (text lists decoded) and
    ``rows``, a list of :class:`Row`."""
    with h5py.File(path, "r") as f:
        attrs = {
            k: (
                [_text(v) for v in value]
                if isinstance(value, np.ndarray) and value.dtype.kind == "S"
                else value.item()
                if isinstance(value, np.generic)
                else value
            )
            for k, value in f.attrs.items()
        }
        rows = [
            Row(
                **{
                    k: (float(v) if k == "ours" else _text(v))
                    for k, v in f["rows"][key].attrs.items()
                    if k in _ROW_FIELDS
                }
            )
            for key in sorted(f["rows"])
        ]
    return {**attrs, "rows": rows}
