"""Logging for the framework's entry points: one logger per module, each message prefixed with its rank.

Every module logs to ``logging.getLogger(__name__)`` and configures nothing,
as the standard library asks of libraries: in a program of one's own the
messages go wherever that program's logging sends them.  The framework's
entry points (``experiments.train``, the benchmarks, the simulator...) call
:func:`configure_logging`, which writes to stderr as
``[rank 3] wagma.ensemble_coordinator: message`` (``warning:`` or
``error:`` before the message of a record of that level); lines of different ranks
interleave in a job's output, and the prefix says whose each one is.
"""

import logging
import os
import sys

__all__ = ["PACKAGES", "configure_logging", "job_rank"]

#: The framework's packages, whose loggers :func:`configure_logging` sets to its level.
PACKAGES = ("collectives", "wagma", "experiments")

#: Where launchers put a process's rank in its environment, for MPICH's hydra and
#: Intel MPI (PMI), Open MPI, PMIx (Open MPI's PRRTE, srun --mpi=pmix), Slurm.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def job_rank() -> int | None:
    """This process's rank in ``MPI.COMM_WORLD`` where MPI is initialized with
    more than one rank, else the rank its launcher put in the environment, else
    None (a process no launcher started: a singleton MPI or none).  Never
    initializes MPI: a tool that reads files need not."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and mpi.COMM_WORLD.Get_size() > 1:
        return mpi.COMM_WORLD.Get_rank()
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


class _Formatter(logging.Formatter):
    """``[rank R] logger.name: message``, with ``warning:`` or ``error:`` before
    the message of a record of that level, and the traceback of an exception."""

    def __init__(self, prefix: str):
        super().__init__("%(message)s")
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else record.levelname.lower() + ": "
        return f"{self.prefix}{record.name}: {level}{super().format(record)}"


def configure_logging(level: int = logging.INFO, rank: int | None = None) -> None:
    """Send the framework's records of ``level`` and above (other libraries':
    warnings and above) to stderr, each line prefixed with the rank (``rank`` or :func:`job_rank`; no prefix for
    a process no launcher started).  Replaces the handlers an earlier call
    installed, so an entry point may call it again once it knows its rank."""
    rank = job_rank() if rank is None else rank
    prefix = "" if rank is None else f"[rank {rank}] "
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(prefix))
    handler.set_name("collectives.logs")
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if h.get_name() != "collectives.logs"] + [handler]
    # ``level`` for the framework's own loggers; other libraries' (matplotlib's
    # font cache, numba's compiler) keep to warnings and errors.
    root.setLevel(max(level, logging.WARNING))
    for name in PACKAGES:
        logging.getLogger(name).setLevel(level)
