"""Tuning tables: which allreduce is fastest, measured for one MPI library, rank count and node shape.

``python -m collectives.bench tune`` times each of our schedules and the
library's own ``MPI_Allreduce`` over buffer sizes (4 KiB to 256 MiB by
default) and writes a table, one JSON file per setting::

    results/tuning/<library>-<version>-n<ranks>-<nodes>x<ranks per node>.json
    e.g. results/tuning/mpich-5.0.2-n4-1x4.json

``allreduce(..., algorithm="auto")`` looks the table up once per
:class:`~collectives.comm.Communicator` (the first time it needs it) and then
takes, for a buffer of ``nbytes``, the fastest entry at the measured size
nearest to ``nbytes`` on a log scale (the smallest or largest measured size
outside the range). With no table for the setting it takes the library's
``MPI_Allreduce`` where that may run, else the fixed thresholds of
:func:`collectives.schedules.blocking.choose_allreduce`.

Where the table is looked up: ``$COLLECTIVES_TUNING``, a table file or a
folder of tables; unset, the repository's ``results/tuning/``.
``COLLECTIVES_TUNING=off`` disables tables. A table measured for another
library, version, rank count or node shape is ignored with a warning
(times measured elsewhere say nothing about this setting); one that cannot
be read is an error naming the file. Rank 0 reads it and broadcasts what it found, so every rank
takes the same decision even where their file systems or environments differ
(a decision that differed across ranks would deadlock the schedules).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mpi4py import MPI

from ..mpi_library import mpi_library

__all__ = [
    "DEFAULT_TUNING_DIR",
    "TUNING_ENV",
    "TuningTable",
    "load_tuning",
    "node_shape",
    "table_name",
    "tuning_setting",
]

TUNING_ENV = "COLLECTIVES_TUNING"
#: The repository's tables, ``results/tuning`` next to the ``collectives``
#: package (as an editable install has it).
DEFAULT_TUNING_DIR = str(Path(__file__).resolve().parents[2] / "results" / "tuning")


def node_shape(comm: MPI.Intracomm) -> tuple[int, int]:
    """``(nodes, ranks per node)`` of ``comm``: collective. Ranks per node is
    the most on any node (a table measured on 2 x 4 ranks applies to 2 x 4)."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leaders = comm.allreduce(1 if local.Get_rank() == 0 else 0, op=MPI.SUM)
        return leaders, comm.allreduce(local.Get_size(), op=MPI.MAX)
    finally:
        local.Free()


def tuning_setting(comm: MPI.Intracomm) -> dict[str, Any]:
    """What a table is keyed by, for ``comm`` (collective: :func:`node_shape`):
    ``{"library", "version", "ranks", "nodes", "ranks_per_node"}``."""
    library, version, _ = mpi_library()
    nodes, per_node = node_shape(comm)
    return dict(library=library, version=version, ranks=comm.Get_size(), nodes=nodes, ranks_per_node=per_node)


def table_name(library: str, version: str, ranks: int, nodes: int, ranks_per_node: int) -> str:
    """The file name of a table: ``mpich-5.0.2-n4-1x4.json``."""
    slug = re.sub(r"[^a-z0-9]+", "", library.lower())
    return f"{slug}-{version}-n{ranks}-{nodes}x{ranks_per_node}.json"


class TuningTable:
    """One measured table: median seconds of each allreduce at each size.

    Attributes:
        sizes: buffer sizes in bytes, ascending.
        seconds: ``{algorithm: [median seconds per size]}``; ``"mpi"`` is the
            library's ``MPI_Allreduce``.
        setting: ``{"library", "version", "ranks", "nodes", "ranks_per_node"}``.
        source: the file it came from.
    """

    def __init__(self, record: Mapping[str, Any], source: str = "") -> None:
        self.sizes = [int(s) for s in record["sizes_bytes"]]
        self.seconds = {name: [float(t) for t in times] for name, times in record["median_seconds"].items()}
        self.setting = {key: record[key] for key in ("library", "version", "ranks", "nodes", "ranks_per_node")}
        self.source = source
        self._chosen: dict[tuple[int, tuple[str, ...], str | None, float], str | None] = {}
        if (
            not self.sizes
            or self.sizes != sorted(self.sizes)
            or any(len(times) != len(self.sizes) for times in self.seconds.values())
        ):
            raise ValueError(
                f"tuning table {source or record}: sizes must ascend and every algorithm must have one time per size"
            )

    def fastest(
        self, nbytes: int, allowed: tuple[str, ...], prefer: str | None = None, margin: float = 1.0
    ) -> str | None:
        """The fastest of ``allowed`` (a tuple of names) at the measured size nearest ``nbytes``
        (log scale), or None if the table measured none of them.  ``prefer``
        (one of ``allowed``) is kept unless another was faster by the factor
        ``margin``."""
        key = (nbytes, allowed, prefer, margin)
        if key not in self._chosen:  # called for every auto allreduce: decide each size once
            candidates = [name for name in self.seconds if name in allowed]
            target = math.log2(max(nbytes, 1))
            index = min(range(len(self.sizes)), key=lambda i: abs(math.log2(self.sizes[i]) - target))
            best = min(candidates, key=lambda name: self.seconds[name][index]) if candidates else None
            if prefer in candidates and best is not None:
                if self.seconds[best][index] * margin > self.seconds[prefer][index]:
                    best = prefer
            self._chosen[key] = best
        return self._chosen[key]

    def to_record(self) -> dict[str, Any]:
        return {**self.setting, "sizes_bytes": self.sizes, "median_seconds": self.seconds}


def _read(path):
    try:
        with open(path) as f:
            return TuningTable(json.load(f), source=path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read the tuning table {path}: {type(exc).__name__}: {exc}") from None


def _find(location, setting):
    """The table at ``location`` for ``setting``: the file itself, or the
    matching file in the folder; None if there is none, or (with a warning)
    if the table was measured for another setting."""
    if location.lower() in ("off", "none", "0", ""):
        return None
    path = location if os.path.isfile(location) else os.path.join(location, table_name(**setting))
    if not os.path.isfile(path):
        return None
    table = _read(path)
    if table.setting != setting:
        warnings.warn(
            f"tuning table {path} ignored: measured for {table.setting}, this is {setting}; "
            f"allreduce(algorithm='auto') takes the library's MPI_Allreduce",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return table


def load_tuning(comm: MPI.Intracomm) -> TuningTable | None:
    """The tuning table for ``comm``'s setting, or None: collective over
    ``comm`` (rank 0 reads, everyone gets its answer; a table for another
    setting is ignored with a warning on rank 0).

    A table that cannot be read raises on every rank (``ValueError`` naming
    the file), rather than silently falling back on some ranks only.
    """
    setting = tuning_setting(comm)
    found = error = None
    if comm.Get_rank() == 0:
        location = os.environ.get(TUNING_ENV, DEFAULT_TUNING_DIR)
        try:
            table = _find(location, setting)
            found = table and (table.to_record(), table.source)
        except ValueError as exc:
            error = f"{TUNING_ENV}={location}: {exc}"
    found, error = comm.bcast((found, error), root=0)
    if error:
        raise ValueError(error)
    return TuningTable(*found) if found else None
