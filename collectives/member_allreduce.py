"""Allreduce over any subset of a communicator's ranks, by point-to-point messages only.

EnsembleSync averages over the ranks that reported in time, a set that
changes from one synchronization to the next.  A communicator over the set
would have to be built each time, and after a rank has died that is not
possible without the whole group: with Open MPI's ULFM, ``Create_group``
over the survivors of a communicator that holds a dead rank fails with
``MPI_ERR_PROC_FAILED`` on one member and hangs the others (measured with
the Open MPI 5.0.11 wheel, ``mpiexec --with-ft ulfm``), and ``Shrink``
would need every living rank, the late ones included.  Point-to-point
messages between living ranks keep working, so the reduction runs on the
parent communicator among the members alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["member_allreduce", "binomial_children", "binomial_parent"]


def binomial_parent(position: int) -> int | None:
    """The parent of ``position`` in a binomial tree rooted at position 0
    (``position`` with its lowest set bit cleared), None for the root."""
    return None if position == 0 else position & (position - 1)


def binomial_children(position: int, size: int) -> list[int]:
    """The children of ``position`` in a binomial tree of ``size`` nodes
    rooted at 0, nearest first: ``position + 2**k`` for every ``2**k`` below
    the lowest set bit of ``position`` (all powers of two for the root)."""
    low = position & -position if position else size
    children, bit = [], 1
    while bit < low and position + bit < size:
        children.append(position + bit)
        bit <<= 1
    return children


def member_allreduce(buf: np.ndarray, comm: MPI.Comm, members: Iterable[int], tag: int) -> np.ndarray:
    """Sum ``buf`` over the ranks ``members`` of ``comm``, in place, on every member.

    A binomial tree over the members in the given order: each member
    receives its children's partial sums (farthest subtree last), adds them,
    and sends the result to its parent; the root (``members[0]``) then sends
    the total back down the same tree.  2 ceil(log2 m) message steps of the
    whole buffer for m members; every member ends with the root's bytes, so
    the result is bitwise the same everywhere whatever the reassociation.

    Collective over ``members`` only: ranks of ``comm`` that are not members
    take no part, and may be stopped or dead.  ``members`` must be the same
    list on every member and ``tag`` unused by other traffic between them
    meanwhile.

    Raises:
        ValueError: this rank is not in ``members``, or a member repeats.
    """
    members = list(members)
    if len(set(members)) != len(members):
        raise ValueError(f"members must not repeat, got {members}")
    if comm.Get_rank() not in members:
        raise ValueError(f"rank {comm.Get_rank()} is not among the members {members}")
    position, size = members.index(comm.Get_rank()), len(members)
    children = binomial_children(position, size)
    parent = binomial_parent(position)
    if children:
        scratch = np.empty_like(buf)
        for child in children:
            comm.Recv(scratch, source=members[child], tag=tag)
            np.add(buf, scratch, out=buf)
    if parent is not None:
        comm.Send(buf, dest=members[parent], tag=tag)
        comm.Recv(buf, source=members[parent], tag=tag)
    for child in reversed(children):
        comm.Send(buf, dest=members[child], tag=tag)
    return buf
