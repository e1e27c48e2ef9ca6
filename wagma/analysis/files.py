"""Finding run files on disk and reading them, skipping what is not one."""

import os
from collections.abc import Iterable

import h5py

from wagma.results import SCHEMA, Run, is_partial, load_run

__all__ = ["find_run_files", "is_partial", "read_runs"]


def find_run_files(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """The files named in ``paths``, directories replaced by the ``*.h5``
    files under them (recursively, sorted; ``*.partial.h5`` included), each
    file once, in the order first named."""
    found: list[str] = []
    seen: set[str] = set()
    for path in (os.fspath(p) for p in paths):
        if os.path.isdir(path):
            names = sorted(
                os.path.join(top, name) for top, _, files in os.walk(path) for name in files if name.endswith(".h5")
            )
        else:
            names = [path]
        for name in names:
            key = os.path.realpath(name)
            if key not in seen:
                seen.add(key)
                found.append(name)
    return found


def _why_not(path: str, error: Exception) -> str:
    """A one-line reason why ``path`` could not be read as a run file."""
    if not os.path.exists(path):
        return "no such file or directory"
    if isinstance(error, ValueError) and "schema" in str(error):
        with h5py.File(path, "r") as f:
            got = f.attrs.get("schema")
        return f"not a run file (schema {got!r}, expected {SCHEMA!r})"
    if isinstance(error, KeyError):
        return f"incomplete run file (missing {error})"
    return f"{type(error).__name__}: {error}".splitlines()[0]


def read_runs(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Run], list[tuple[str, str]]]:
    """Load every run file in ``paths`` (files or directories).

    Returns:
        ``(runs, skipped)``: the :class:`~wagma.results.reader.Run` of each file
        that could be read, in :func:`find_run_files` order, and a
        ``(path, reason)`` pair for each one that could not (missing, not
        HDF5, not of the run schema, truncated).
    """
    runs: list[Run] = []
    skipped: list[tuple[str, str]] = []
    for path in find_run_files(paths):
        if os.path.isfile(path) and not h5py.is_hdf5(path):
            skipped.append((path, "not an HDF5 file"))
            continue
        try:
            runs.append(load_run(path))
        except (OSError, ValueError, KeyError, TypeError) as error:
            skipped.append((path, _why_not(path, error)))
    return runs, skipped
