"""StragglAR plans at scale: one verified schedule per n, shared from one rank, relabelled per straggler.

A schedule has about n**2 transfers (a million at n = 1024), and generating
and verifying one in Python takes seconds there; doing it on every rank for
every newly predicted straggler costs every rank that much at each new
prediction.  Two facts make it a cost paid once per n:

* Every schedule is the one for straggler n - 1, relabelled
  (:func:`~collectives.stragglar.generator.generate`): straggler n - 1 becomes
  the straggler s and the g-th non-straggler becomes the g-th rank other than
  s.  :func:`~collectives.stragglar.verify.verify` looks at ranks only to
  tell them apart and to find each chunk's owner, which the relabelling maps
  to the new owner (:meth:`~collectives.stragglar.schedule.Schedule.owner`),
  so the replay of a relabelled schedule is the relabelled replay: if the
  schedule for straggler n - 1 is verified, so is every relabelling of it.
  A rank's part for any straggler is read from that one schedule
  (:func:`rank_steps`), in milliseconds.
* That one schedule (the *plan* of n, :class:`CanonicalPlan`) is built on one
  rank: rank 0 of the communicator reads it from the plan cache or generates
  and verifies it, and broadcasts it as two integer arrays with their
  SHA-256 digest (:func:`shared_plan`).  A plan whose digest does not match
  (a torn or altered cache file, a damaged message) is rebuilt, never used.

The plan cache: ``$COLLECTIVES_PLAN_CACHE``, a folder, or ``off``; by default
``$XDG_CACHE_HOME/collectives/stragglar`` (``~/.cache/...``).  One file per n,
``plan-n{n}.npz``, written atomically.  The digest guards against damage,
not against someone who may write that folder: a plan written there with a
matching digest is trusted as verified.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .generator import generate, relabelling
from .schedule import Schedule, Transfer
from .verify import verify

__all__ = [
    "PLAN_CACHE_ENV",
    "CanonicalPlan",
    "build_plan",
    "load_plan",
    "plan_cache_dir",
    "rank_steps",
    "received_plan",
    "shared_plan",
    "store_plan",
]

log = logging.getLogger(__name__)

#: The environment variable naming the plan cache folder (``off``: none).
PLAN_CACHE_ENV = "COLLECTIVES_PLAN_CACHE"
#: Bumped when the encoding changes, so that no older file reads as a plan.
_FORMAT = b"stragglar-plan-1"


@dataclass(frozen=True)
class CanonicalPlan:
    """The verified schedule of n ranks for straggler n - 1, as arrays.

    ``transfers``: int32, one row ``(src, dst, chunk, reduce)`` per transfer,
    round after round; ``round_starts``: int64, round r is rows
    ``round_starts[r]:round_starts[r + 1]``; ``digest``: the SHA-256 (hex) of
    n and both arrays.
    """

    n: int
    transfers: np.ndarray
    round_starts: np.ndarray
    digest: str

    @property
    def rounds(self) -> int:
        return len(self.round_starts) - 1

    def intact(self) -> bool:
        """Whether the arrays still have the digest they were given."""
        return _digest(self.n, self.transfers, self.round_starts) == self.digest

    def schedule(self, straggler: int) -> Schedule:
        """The relabelled :class:`~collectives.stragglar.schedule.Schedule`
        for ``straggler`` (Python objects: seconds at n = 1024)."""
        rank = relabelling(self.n, straggler)
        rows = self.transfers.tolist()
        rounds = [
            [Transfer(rank[src], rank[dst], chunk, bool(reduce)) for src, dst, chunk, reduce in rows[lo:hi]]
            for lo, hi in zip(self.round_starts[:-1].tolist(), self.round_starts[1:].tolist())
        ]
        return Schedule(self.n, straggler, rounds)


def _digest(n: int, transfers: np.ndarray, round_starts: np.ndarray) -> str:
    h = hashlib.sha256(_FORMAT)
    h.update(np.int64(n).tobytes())
    h.update(np.ascontiguousarray(round_starts, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(transfers, dtype=np.int32).tobytes())
    return h.hexdigest()


def _encode(schedule: Schedule) -> CanonicalPlan:
    counts = [len(r) for r in schedule.rounds]
    round_starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=round_starts[1:])
    transfers = np.array(
        [(t.src, t.dst, t.chunk, t.reduce) for r in schedule.rounds for t in r], dtype=np.int32
    ).reshape(-1, 4)
    return CanonicalPlan(schedule.n, transfers, round_starts, _digest(schedule.n, transfers, round_starts))


def build_plan(n: int) -> CanonicalPlan:
    """Generate and verify the plan of ``n`` ranks (the expensive path)."""
    return _encode(verify(generate(n)))


def plan_cache_dir() -> str | None:
    """The plan cache folder (see the module), or None where it is ``off``."""
    given = os.environ.get(PLAN_CACHE_ENV)
    if given:
        return None if given == "off" else given
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "collectives", "stragglar")


def _path(folder: str, n: int) -> str:
    return os.path.join(folder, f"plan-n{n}.npz")


def load_plan(folder: str, n: int) -> CanonicalPlan | None:
    """The plan of ``n`` from ``folder``, or None where there is none or it
    does not match its digest (logged: it is then rebuilt)."""
    path = _path(folder, n)
    try:
        with np.load(path, allow_pickle=False) as f:
            plan = CanonicalPlan(n, f["transfers"], f["round_starts"], str(f["digest"]))
        if (plan.transfers.dtype, plan.transfers.ndim, plan.transfers.shape[-1], plan.round_starts.dtype) != (
            np.dtype(np.int32),
            2,
            4,
            np.dtype(np.int64),
        ):
            raise ValueError("arrays of other types or shapes than a plan's")
    except FileNotFoundError:
        return None
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("StragglAR plan %s unreadable (%s): rebuilding it", path, exc)
        return None
    if not plan.intact():
        log.warning("StragglAR plan %s does not match its digest: rebuilding it", path)
        return None
    return plan


def store_plan(folder: str, plan: CanonicalPlan) -> None:
    """Write ``plan`` into ``folder`` atomically (a reader sees the old file
    or the whole new one); a folder that cannot be written is logged, not raised."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".npz", delete=False) as f:
            np.savez(f, transfers=plan.transfers, round_starts=plan.round_starts, digest=np.str_(plan.digest))
        os.replace(f.name, _path(folder, plan.n))
    except OSError as exc:
        log.warning("StragglAR plan cache %s not written: %s", folder, exc)


def _load_or_build(n: int) -> CanonicalPlan:
    folder = plan_cache_dir()
    plan = load_plan(folder, n) if folder else None
    if plan is None:
        plan = build_plan(n)
        if folder:
            store_plan(folder, plan)
    return plan


#: The plans this process holds, by n (a few at most: one per communicator size).
_plans: dict[int, CanonicalPlan] = {}


def shared_plan(comm: MPI.Intracomm, n: int) -> CanonicalPlan:
    """The plan of ``n`` on every rank of ``comm`` (collective).

    A process keeps the plans it has; where every rank has the plan of n
    already, this is one allreduce of an int.  Otherwise rank 0 reads it
    from the plan cache (or generates, verifies and caches it) and
    broadcasts it; a rank that receives arrays that do not match the
    digest rank 0 sent rebuilds the plan itself.
    """
    held = _plans.get(n)
    if comm.allreduce(held is not None, op=MPI.LAND):
        assert held is not None
        return held
    sent = None
    if comm.rank == 0:
        sent = held if held is not None and held.intact() else _load_or_build(n)
    header = comm.bcast(None if sent is None else (sent.digest, sent.transfers.shape[0], sent.round_starts.shape[0]))
    digest, transfers_len, starts_len = header
    if comm.rank == 0:
        assert sent is not None
        transfers, round_starts = sent.transfers, sent.round_starts
    else:
        transfers = np.empty((transfers_len, 4), dtype=np.int32)
        round_starts = np.empty(starts_len, dtype=np.int64)
    comm.Bcast(round_starts)
    comm.Bcast(transfers)
    plan = sent if comm.rank == 0 else received_plan(n, digest, transfers, round_starts)
    assert plan is not None
    _plans[n] = plan
    return plan


def received_plan(n: int, digest: str, transfers: np.ndarray, round_starts: np.ndarray) -> CanonicalPlan:
    """The plan of ``n`` made of what another rank sent: as it came where the
    arrays match ``digest``, else generated and verified here (logged)."""
    plan = CanonicalPlan(n, transfers, round_starts, digest)
    if plan.intact():
        return plan
    log.warning("StragglAR plan of n=%d received does not match its digest: rebuilding it", n)
    return build_plan(n)


def rank_steps(plan: CanonicalPlan, straggler: int, rank: int, chunks: Sequence[int]) -> list:
    """``rank``'s part of each round of ``plan`` relabelled for ``straggler``:
    ``(send, recv)`` as the runtime runs them,
    ``send = (dst, lo, hi)``, ``recv = (src, lo, hi, reduce)`` in elements
    (chunk c is ``chunks[c]:chunks[c + 1]``), None where it does neither;
    rounds where it does nothing are left out.  Reads only the rows of its
    canonical label (milliseconds at n = 1024)."""
    n = plan.n
    label = n - 1 if rank == straggler else (rank if rank < straggler else rank - 1)
    ranks = relabelling(n, straggler)
    src, dst = plan.transfers[:, 0], plan.transfers[:, 1]
    rows = np.flatnonzero((src == label) | (dst == label))
    rounds = np.searchsorted(plan.round_starts, rows, side="right") - 1
    steps: list = []
    last = -1
    for row, r in zip(rows.tolist(), rounds.tolist()):
        s, d, chunk, reduce = plan.transfers[row].tolist()
        lo, hi = int(chunks[chunk]), int(chunks[chunk + 1])
        if r != last:
            steps.append([None, None])
            last = r
        if s == label:
            steps[-1][0] = (ranks[d], lo, hi)
        else:
            steps[-1][1] = (ranks[s], lo, hi, bool(reduce))
    return [tuple(step) for step in steps]
