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

from .compression.allreduce import Compressor, encode_with_feedback

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


def member_allreduce(
    buf: np.ndarray, comm: MPI.Comm, members: Iterable[int], tag: int, compressor: Compressor | None = None
) -> np.ndarray:
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

    With ``compressor`` (a float32 buffer's compressed stream): each partial
    sum goes up encoded once by its sender (with the sender's residual), is
    decoded and added in float32; the root encodes the total once, takes
    what it decodes to, and the same bytes go down the tree, so every member
    still ends with the same floats.

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
    if compressor is not None:
        _compressed(buf.reshape(-1), comm, members, tag, children, parent, compressor)
        return buf
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


def _compressed(x, comm, members, tag, children, parent, compressor):
    """:func:`member_allreduce`'s tree with encoded messages."""
    codec = compressor.codec
    wire = np.empty(codec.wire_nbytes(x.size), np.uint8)
    if children:
        part = np.empty_like(x)
        for child in children:
            comm.Recv(wire, source=members[child], tag=tag)
            codec.decode(wire, part)
            np.add(x, part, out=x)
    # One residual for whatever this rank sends (its partial sum up, or as the root the total down):
    # what it failed to send goes into its next send, whichever role the next round gives it.
    residual = compressor.owner_residual
    if parent is not None:
        up = encode_with_feedback(codec, x, residual)
        comm.Send(up, dest=members[parent], tag=tag)
        compressor.bytes_sent += up.size
        comm.Recv(wire, source=members[parent], tag=tag)
        codec.decode(wire, x)
    else:
        wire = encode_with_feedback(codec, x, residual, out=x)  # the root takes what it sends
    for child in reversed(children):
        comm.Send(wire, dest=members[child], tag=tag)
        compressor.bytes_sent += wire.size
