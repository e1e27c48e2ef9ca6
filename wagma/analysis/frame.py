"""The comparison rows as a pandas DataFrame, for notebooks (pandas is optional)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .files import read_runs
from .table import ROW_FIELDS, compare

if TYPE_CHECKING:
    import pandas

__all__ = ["to_dataframe"]


def to_dataframe(
    paths: Iterable[str | os.PathLike[str]],
    baseline: str = "allreduce_sgd",
    target_accuracy: float = 0.9,
    skip: int | None = None,
) -> pandas.DataFrame:
    """The :func:`~wagma.analysis.table.compare` rows of the run files in
    ``paths`` (files or directories) as a ``pandas.DataFrame``, one column
    per :data:`~wagma.analysis.table.ROW_FIELDS` name.

    Files that cannot be read are left out (see
    :func:`~wagma.analysis.files.read_runs` for why).  Raises ImportError
    when pandas is not installed: it is not a dependency of this package.
    """
    try:
        import pandas
    except ImportError as error:
        raise ImportError(
            "to_dataframe needs pandas, which wagma does not depend on; "
            "install it, or use wagma.analysis.compare (a list of dicts)"
        ) from error
    runs, _ = read_runs(paths)
    rows = compare(runs, baseline=baseline, target_accuracy=target_accuracy, skip=skip)
    return pandas.DataFrame(rows, columns=list(ROW_FIELDS))
