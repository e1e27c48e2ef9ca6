"""EnsembleSync's parameter-server bookkeeping on rank 0: who takes part in each synchronization, decided
with a timeout.

The paper's server (section 3.3) keeps a lock per worker, a
``time_last_seen`` per worker and a background thread that marks a worker
dead when it has not been seen for TIMEOUT, releasing the others; a dead
worker that communicates again is *recovered*, gets the current epoch, fast
forwards to it and waits for the others to reach the next synchronization.

Here that bookkeeping is a thread on rank 0 (:class:`Coordinator`), and the
parameters never pass through it: the members of a synchronization average
among themselves (:func:`collectives.member_allreduce.member_allreduce`).
The server's only traffic is one small report per rank per synchronization
and one small decision back, so rank 0 trains like the others.

Rounds: round r ends at the global step ``min((r + 1) T, total)``.  A rank
reports round r after its step ``end(r) - 1``: the samples it processed in
the round and the seconds its steps took (for the reallocation).  The round
opens at its first report and closes

* when every *expected* rank has reported (expected: neither known absent
  nor known dead; under ULFM a rank whose death MPI reports,
  ``Get_failed``, is dead at once, so its death costs no timeout), or
* ``timeout`` seconds after it opened: the ranks that have not reported are
  *absent* (late; *dead* where ULFM's ``Get_failed`` lists them) and are no
  longer waited for in later rounds, so a rank that never comes back costs
  one timeout in all;
* the last round (``final``) has no timeout: it waits for every rank that
  is not dead, so that every living rank ends the run holding the same
  model and takes part in the run's closing messages;
* where dead ranks are replaced (:attr:`Coordinator.heal`), a round open
  while the coordinator knows of a dead rank has no timeout either: it
  waits for every living rank, absent ones included, and its decision
  says how many are dead (``heal``).  Every living rank then stands at
  that round's end step (a late one skips to it), the one step at which
  the training loop can bring replacements in
  (:func:`wagma.healing.replace`, collective over the members).

A report for a round that has already closed comes from a late rank: it
becomes a *joiner* of the round now open, takes part in its average with
weight 0 (it adopts the ensemble, as the paper's recovered worker pulls the
server's parameters) and is expected again from then on.

The decision for round r, sent to its members and joiners, holds the round,
its end step, whether it was the last round, the dead it waited to heal
(0 in any other round), each rank's weight (its samples of the round; 0 for a joiner;
-1 not taking part), each rank's samples per step for the next round (the
reallocation, :class:`wagma.reallocation.Reallocation`, or the unchanged
batch).  Every closed round is logged
(:attr:`Coordinator.log`) for the run file.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI
from numpy.typing import ArrayLike

from collectives.failures import any_source, failed_ranks, hold, mpi_failure, waitall

if TYPE_CHECKING:
    from .reallocation import Reallocation

__all__ = ["Coordinator", "Decision", "ROUND_FIELDS", "STATUS", "TAG_DECISION", "TAG_REPORT", "fault_events"]

TAG_REPORT, TAG_DECISION, _TAG_STOP = 51, 52, 53

#: A rank's status in a closed round, as logged.
STATUS = {"member": 1, "joiner": 0, "late": -1, "dead": -2}

#: The columns of a logged round (:attr:`Coordinator.log`), then one status
#: and one share (samples per step of the next round) per rank.
ROUND_FIELDS = ("round", "end_step", "opened", "closed", "waited", "timed_out", "final")

_REPORT_WIDTH = 5  # round, end step, samples, seconds, final


def fault_events(rows: ArrayLike, ranks: int) -> list[dict[str, Any]]:
    """The outages a round log shows, one dict per rank and outage: the
    rank, ``kind`` (``"late"``: it came back, ``"dead"``), the first round
    and step it missed, the seconds the others waited for it at that round
    (the timeout when it timed out; how long until the others went on) and,
    for a late rank, the round and end step at which it rejoined."""
    rows = np.asarray(rows, dtype=float).reshape(-1, len(ROUND_FIELDS) + 2 * ranks)
    status = rows[:, len(ROUND_FIELDS) : len(ROUND_FIELDS) + ranks]
    events: list[dict[str, Any]] = []
    for rank in range(ranks):
        missing: dict[str, Any] | None = None
        for i, row in enumerate(rows):
            if status[i, rank] < 0 and missing is None:
                missing = {
                    "rank": rank,
                    "kind": "late",
                    "missed_round": int(row[0]),
                    "missed_step": int(row[1]),
                    "others_waited_s": float(row[4]),
                }
                events.append(missing)
            if status[i, rank] == STATUS["dead"] and missing is not None:  # always: dead is a negative status
                missing["kind"] = "dead"
            if status[i, rank] == STATUS["joiner"] and missing is not None:
                missing.update(rejoined_round=int(row[0]), rejoined_step=int(row[1]))
                missing = None
    return events


class Decision:
    """What a rank learns when a round closes (see the module docstring)."""

    def __init__(self, array: np.ndarray, ranks: int) -> None:
        self.round, self.end_step = int(array[0]), int(array[1])
        self.final = bool(array[2])
        #: The ranks found dead, where the round waited for every living one so that they be replaced; else 0.
        self.heal = int(array[3])
        self.weights = array[4 : 4 + ranks]
        self.shares = array[4 + ranks : 4 + 2 * ranks].astype(np.int64)

    @staticmethod
    def width(ranks: int) -> int:
        return 4 + 2 * ranks

    @property
    def members(self) -> list[int]:
        """The ranks that average in this round (weight >= 0), in rank order."""
        return [int(r) for r in np.flatnonzero(self.weights >= 0)]


class Coordinator:
    """Rank 0's thread: collects reports, closes rounds, sends decisions.

    Args:
        comm: an ``mpi4py.MPI.Intracomm`` on which the coordinator alone
            receives (the reports; the caller's duplicate).
        answers: another duplicate, for the decisions.  Two channels
            because rank 0 is also a worker: its own decision, sent to
            itself before its main thread has posted the receive, would
            otherwise match the coordinator's probe for the next report.
        timeout: seconds a round waits after its first report.
        policy: a :class:`wagma.reallocation.Reallocation`, or None to keep
            ``batch_size`` samples per step on every rank.
        batch_size: the per-rank batch (the shares without reallocation).

    Attributes:
        heal: whether dead ranks are replaced: a round open while a rank is
            known dead then waits for every living rank (module docstring).
            Set by the caller at any time; False by default.
    """

    def __init__(
        self, comm: MPI.Intracomm, answers: MPI.Intracomm, timeout: float, policy: Reallocation | None, batch_size: int
    ) -> None:
        self.comm, self.answers, self.timeout, self.policy = comm, answers, float(timeout), policy
        self.ranks = comm.Get_size()
        self.batch_size = batch_size
        self.heal = False
        #: One row per closed round (:data:`ROUND_FIELDS`, statuses, shares).
        self.log: list[list[float]] = []
        self._lock = threading.Lock()
        self._absent: set[int] = set()
        self._dead: set[int] = set()
        self._open = 0  # the round that is collecting reports
        self._reports: dict[int, np.ndarray] = {}
        self._joiners: set[int] = set()
        self._opened: float | None = None
        self._final, self._end_step = False, 0
        self._sending: list[tuple[MPI.Request, np.ndarray]] = []
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._serve, name="ensemble-coordinator", daemon=True)
        self._thread.start()

    def plan(self, policy: Reallocation | None, batch_size: int) -> None:
        """Set the reallocation policy and the batch before the first report."""
        with self._lock:
            self.policy, self.batch_size = policy, batch_size

    @property
    def dead(self) -> set[int]:
        """The ranks found dead (ULFM's ``Get_failed``) when a round closed."""
        with self._lock:
            return set(self._dead)

    def columns(self) -> list[str]:
        """The names of the columns of :meth:`rows`."""
        return [*ROUND_FIELDS, *(f"status_{r}" for r in range(self.ranks)), *(f"share_{r}" for r in range(self.ranks))]

    def rows(self) -> np.ndarray:
        """The log so far, one row per closed round (a copy)."""
        with self._lock:
            width = len(ROUND_FIELDS) + 2 * self.ranks
            return np.array(self.log, dtype=float).reshape(-1, width)

    def stop(self) -> None:
        """Ends the thread (called by rank 0 after its last round)."""
        self.comm.Send(np.zeros(_REPORT_WIDTH), dest=0, tag=_TAG_STOP)
        self._thread.join()
        waitall([request for request, _ in self._sending])

    # The thread.

    def abandon(self) -> None:
        """After a failure, once the channels are revoked: join the thread,
        which ends on its revoked channel; the decisions in flight are let go."""
        self._thread.join(timeout=5.0)
        hold(self)  # decisions in flight: never freed under their sends

    def _serve(self):
        """The thread's body: a failure here would leave every rank waiting
        for a decision, so it ends the job instead, with the traceback.  A
        revoked channel (the survivors of a dead rank recover, under ULFM)
        ends it quietly."""
        try:
            self._serve_rounds()
        except BaseException as exc:
            if mpi_failure(exc) is not None:
                return
            print(
                "".join(
                    f"[rank 0, ensemble coordinator] {line}\n" for line in traceback.format_exc().rstrip().splitlines()
                ),
                file=sys.stderr,
                flush=True,
            )
            MPI.COMM_WORLD.Abort(1)

    def _serve_rounds(self):
        status = MPI.Status()
        report = np.zeros(_REPORT_WIDTH)
        while True:
            if self._opened is None:  # nothing to time: block until a report (or the stop) comes
                any_source(self.comm, self.comm.Probe, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                arrived = True
            else:
                arrived = any_source(self.comm, self.comm.Iprobe, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if arrived:
                self.comm.Recv(report, source=status.Get_source(), tag=status.Get_tag())
                if status.Get_tag() == _TAG_STOP:
                    return
                self._take(status.Get_source(), report.copy())
            elif self._opened is not None and self._expired():
                self._close(timed_out=True)
            else:
                time.sleep(0.002)  # a round is open: wait for reports against its deadline
            if self._opened is not None and self._complete():
                self._close(timed_out=False)

    def _take(self, rank, report):
        round_, final = int(report[0]), bool(report[4])
        if round_ < self._open:  # late for a round already closed: join the open one
            self._joiners.add(rank)
            self._absent.discard(rank)
            return
        self._reports[rank] = report
        self._absent.discard(rank)
        self._final = final
        self._end_step = int(report[1])
        if self._opened is None:
            self._opened = time.monotonic()

    def _expected(self):
        return set(range(self.ranks)) - self._absent - self._dead

    def _waits_for_all(self):
        """The last round, and a round that heals: no timeout, every living rank."""
        return self._final or (self.heal and bool(self._dead))

    def _complete(self):
        if not self._reports:
            return False  # joiners alone wait for the next round's members
        arrived = set(self._reports) | self._joiners
        with self._lock:  # the dead MPI knows of (ULFM): a round waits for none of them
            self._dead |= failed_ranks(self.comm) - arrived
        if self._waits_for_all():
            return arrived >= set(range(self.ranks)) - self._dead
        return arrived >= self._expected()

    def _expired(self):
        return not self._waits_for_all() and self._reports and time.monotonic() - self._opened >= self.timeout

    def _close(self, timed_out):
        ranks, closed = self.ranks, time.monotonic()
        arrived = set(self._reports) | self._joiners
        missing = set(range(ranks)) - arrived
        with self._lock:
            self._dead |= failed_ranks(self.comm) & missing
        self._absent |= missing - self._dead
        # Healed: every living rank is here (a death found only now leaves the absent ones out: the next round heals).
        everyone = not missing - self._dead
        heal = len(self._dead) if self.heal and self._dead and everyone and not self._final else 0
        weights = np.full(ranks, -1.0)
        samples, seconds = np.zeros(ranks), np.zeros(ranks)
        for rank, report in self._reports.items():
            weights[rank], samples[rank], seconds[rank] = report[2], report[2], report[3]
        for rank in self._joiners:
            weights[rank] = 0.0
        with self._lock:
            policy, batch_size = self.policy, self.batch_size
        if policy is not None:
            shares = policy.update(samples, seconds, present=weights >= 0)
        else:
            shares = np.where(weights >= 0, batch_size, 0)
        status = np.array(
            [
                STATUS["member"]
                if r in self._reports
                else STATUS["joiner"]
                if r in self._joiners
                else STATUS["dead"]
                if r in self._dead
                else STATUS["late"]
                for r in range(ranks)
            ]
        )
        with self._lock:  # logged before anyone learns of it: a member that reads the log sees its round
            self.log.append(
                [
                    self._open,
                    self._end_step,
                    self._opened - self._start,
                    closed - self._start,
                    closed - self._opened,
                    timed_out,
                    self._final,
                    *status,
                    *shares,
                ]
            )
        decision = np.concatenate([[self._open, self._end_step, self._final, heal], weights, shares]).astype(float)
        for rank in sorted(arrived):
            self._sending.append((self.answers.Isend(decision, dest=rank, tag=TAG_DECISION), decision))
        self._sending = [(r, b) for r, b in self._sending if not r.Test()]
        self._open += 1
        self._reports, self._joiners, self._opened = {}, set(), None
