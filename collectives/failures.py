"""What a communicator knows of failed ranks (ULFM), for code that must go on without them.

With Open MPI's ULFM (``mpiexec --with-ft ulfm``) a rank that dies does not
end the job: operations that involve it return ``MPI_ERR_PROC_FAILED``, and
receives and probes from ``MPI_ANY_SOURCE`` return
``MPI_ERR_PROC_FAILED_PENDING`` until the caller acknowledges the failures it
has been told of (``MPI_Comm_ack_failed``), since the message it waits for
might have come from the dead rank.  Point-to-point messages between living
ranks are unaffected.  Without fault tolerance (MPICH's wheel, or Open MPI
without ``--with-ft ulfm``) the launcher ends the job when a rank dies, and
these helpers see no failures.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mpi4py import MPI

__all__ = ["FAILURE_CLASSES", "any_source", "failed_ranks", "fault_tolerant"]

#: The error classes that mean "a rank of this communicator has failed".
FAILURE_CLASSES: frozenset[int] = frozenset(
    getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING") if hasattr(MPI, name)
)


#: What the ``call`` of :func:`any_source` returns, which it hands back.
ResultT = TypeVar("ResultT")


def fault_tolerant(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this job was started with MPI fault tolerance: Open MPI's
    ULFM switch (``mpiexec --with-ft ulfm``, or the MCA parameter
    ``mpi_ft_enable``, both of which reach the ranks as
    ``OMPI_MCA_mpi_ft_enable=1``); the only library here that has it."""
    environ = os.environ if environ is None else environ
    return environ.get("OMPI_MCA_mpi_ft_enable", "0").lower() in ("1", "true", "yes", "enabled")


def failed_ranks(comm: MPI.Comm) -> set[int]:
    """The ranks of ``comm`` that MPI knows to have failed
    (``MPI_Comm_get_failed``); empty where the library has no such call."""
    try:
        group = comm.Get_failed()
    except (NotImplementedError, MPI.Exception):
        return set()
    if group.Get_size() == 0:
        if group != MPI.GROUP_EMPTY:
            group.Free()
        return set()
    everyone = comm.Get_group()
    try:
        return set(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), everyone))
    finally:
        group.Free()
        everyone.Free()


def any_source(comm: MPI.Comm, call: Callable[..., ResultT], *args: Any) -> ResultT:
    """``call(*args)``, a receive or probe from ``MPI_ANY_SOURCE`` on
    ``comm``, retried after acknowledging the failures that made it return
    ``MPI_ERR_PROC_FAILED_PENDING`` (so that a dead rank cannot block
    messages from the living ones).  Other errors propagate."""
    while True:
        try:
            return call(*args)
        except MPI.Exception as error:
            if error.Get_error_class() not in FAILURE_CLASSES:
                raise
            comm.Ack_failed()
