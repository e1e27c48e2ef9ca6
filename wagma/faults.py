"""Injected faults, by rank and step: a rank that is slow for a while, stops answering, or dies.

The three kinds of fault of EnsembleSync (Xie and Yasunaga, section 4.2),
each injected for real into the rank's own process at the start of a step,
the same plan on every rank (``experiments.train --fault SPEC``, repeatable):

``slow:rank=R,steps=A-B,ms=MS``
    rank R's steps A..B (inclusive) each take MS longer (a sleep before the
    step's compute; the paper: +0.5 s per step over epochs 5-15).
``stop:rank=R,step=S,seconds=SEC``
    at the start of step S rank R stops answering for SEC seconds: it starts
    a helper process that sends it ``SIGCONT`` after SEC seconds and sends
    itself ``SIGSTOP`` (the paper's unresponsive worker; its MPI progress
    stops with it).
``kill:rank=R,step=S[,how=sigkill|sigsegv|exit]``
    rank R dies at step S (the paper's dead worker): ``sigkill`` (the
    default) and ``sigsegv`` send itself the signal at the start of the
    step (S equal to the run's step count: after the last step, as the
    final evaluation starts); ``exit`` leaves with ``os._exit`` from inside the step's
    communication (the optimizer's post-step hook: the model-averaging
    algorithms' collectives follow at once, and the peers are inside
    them).  ``exit`` uses status 0: under ``--with-ft ulfm`` Open MPI's
    launcher (PRRTE 3) hangs on a rank that exits with another status.

What the other ranks do about it is the algorithm's and the MPI library's
business: a synchronous algorithm waits out a stop and, without fault
tolerance, the launcher ends the job after a kill. The plan is stored in the
run file (attribute ``faults``) and the outage shows in the steps' times.
"""

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

__all__ = ["DEATHS", "FAULT_FORMS", "Fault", "FaultInjector", "die", "parse_fault", "parse_faults", "signal_after_stop"]

FAULT_FORMS = (
    "slow:rank=R,steps=A-B,ms=MS",
    "stop:rank=R,step=S,seconds=SEC",
    "kill:rank=R,step=S[,how=sigkill|sigsegv|exit]",
)
_FIELDS = {"slow": ("rank", "steps", "ms"), "stop": ("rank", "step", "seconds"), "kill": ("rank", "step")}
#: How a killed rank dies (``kill``'s optional field ``how``).
DEATHS = ("sigkill", "sigsegv", "exit")


class Fault(NamedTuple):
    """One injected fault: ``kind`` on ``rank`` from step ``first`` to
    ``last`` (one step for stop and kill), ``seconds`` per step (slow) or in
    all (stop)."""

    kind: str
    rank: int
    first: int
    last: int
    seconds: float
    how: str = "sigkill"


def _bad(spec, why):
    return ValueError(f"--fault {spec!r}: {why}; accepted forms: {'; '.join(FAULT_FORMS)}")


def parse_fault(spec: str, ranks: int, steps: int) -> Fault:
    """The :class:`Fault` that ``spec`` names, for a run of ``ranks`` ranks
    and ``steps`` steps (numbered from 0).

    Raises:
        ValueError: an unknown kind, a missing, unknown or malformed field, a
            rank or step that does not exist in the run, a non-positive
            duration; the message names ``--fault`` and the accepted forms.
            Pure, so every rank raises the same error before any message.
    """
    kind, _, body = spec.strip().partition(":")
    if kind not in _FIELDS:
        raise _bad(spec, f"unknown kind {kind!r}")
    fields = dict(item.partition("=")[::2] for item in body.split(",") if item)
    how = fields.pop("how", "sigkill") if kind == "kill" else "sigkill"
    if sorted(fields) != sorted(_FIELDS[kind]):
        raise _bad(
            spec, f"{kind} takes exactly the fields {', '.join(_FIELDS[kind])}{' (and how)' if kind == 'kill' else ''}"
        )
    if how not in DEATHS:
        raise _bad(spec, f"how must be one of {', '.join(DEATHS)}, got {how!r}")
    if not re.fullmatch(r"\d+", fields["rank"]) or int(fields["rank"]) >= ranks:
        raise _bad(spec, f"rank must be an integer in [0, {ranks - 1}] (the ranks of this run), got {fields['rank']!r}")
    span = fields.get("steps") or fields["step"]
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", span)
    if not match or (kind != "slow" and match.group(2)):
        raise _bad(spec, f"{'steps must be A-B' if kind == 'slow' else 'step must be an integer'}, got {span!r}")
    first = int(match.group(1))
    last = int(match.group(2) or first)
    # A kill may also come after the last step, during the final evaluation (step S = steps).
    end = steps + 1 if kind == "kill" and how != "exit" else steps
    if not first <= last < end:
        raise _bad(
            spec,
            f"steps must lie in [0, {end - 1}] (this run has {steps} steps"
            f"{'; a kill at step ' + str(steps) + ' strikes during the final evaluation' if end > steps else ''}), "
            f"got {span}",
        )
    seconds = 0.0
    if kind != "kill":
        try:
            seconds = float(fields["ms"]) / 1e3 if kind == "slow" else float(fields["seconds"])
        except ValueError:
            raise _bad(spec, "the duration must be a number") from None
        if not seconds > 0:
            raise _bad(spec, "the duration must be above zero")
    return Fault(kind, int(fields["rank"]), first, last, seconds, how)


def parse_faults(specs: Iterable[str] | None, ranks: int, steps: int) -> list[Fault]:
    """:func:`parse_fault` for each of ``specs`` (``None``: no faults)."""
    return [parse_fault(spec, ranks, steps) for spec in specs or ()]


class FaultInjector:
    """Carries out this rank's share of a fault plan, step by step."""

    def __init__(self, faults: Iterable[Fault], rank: int, *, after: int = -1) -> None:
        """``after``: for a replacement that takes row ``rank`` over at step
        ``after + 1`` (:mod:`wagma.healing`): a stop or a kill at or before
        that step was the dead rank's and does not strike again (the
        survivors went on from the start of the step it died in); a slow
        stretch goes on where it lasts beyond it (the row's device is slow)."""
        self.faults = list(faults)
        self._mine = [f for f in self.faults if f.rank == rank and (f.kind == "slow" or f.first > after)]
        self._exit_at: int | None = None

    def arm(self, optimizer: "torch.optim.Optimizer", steps: "Callable[[], int]") -> None:
        """Hook this rank's ``exit`` deaths into ``optimizer``'s post-step
        hook, which fires inside the algorithm's step; ``steps()`` says the
        step in progress."""
        for fault in self._mine:
            if fault.kind == "kill" and fault.how == "exit":
                at = fault.first
                optimizer.register_step_post_hook(lambda *_: die("exit") if steps() == at else None)

    def before_step(self, step: int) -> float:
        """Inject this rank's faults for ``step``; returns the seconds a slow
        fault slept (a stop returns after the rank was continued, a kill does
        not return)."""
        slept = 0.0
        for fault in self._mine:
            if not fault.first <= step <= fault.last:
                continue
            if fault.kind == "slow":
                time.sleep(fault.seconds)
                slept += fault.seconds
            elif fault.kind == "stop":
                _stop_for(fault.seconds)
            elif fault.how != "exit":  # an exit comes from inside the step (arm)
                die(fault.how)
        return slept

    def record(self) -> str:
        """The plan as JSON, for the run file's ``faults`` attribute (``how``
        for kills only)."""
        return json.dumps(
            [{k: v for k, v in f._asdict().items() if k != "how" or f.kind == "kill"} for f in self.faults]
        )


def die(how: str) -> None:
    """End this process as ``how`` (one of :data:`DEATHS`) says, at once:
    ``sigkill`` and ``sigsegv`` by sending itself the signal, ``exit`` by
    ``os._exit(0)``, without MPI's knowledge (status 0, so that the
    launcher's exit status stays the survivors')."""
    if how == "exit":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL if how == "sigkill" else signal.SIGSEGV)


def _stop_for(seconds: float):
    """Stop this process (``SIGSTOP``) for ``seconds``, then it is continued
    (:func:`signal_after_stop` with ``SIGCONT``); the helper is waited for
    afterwards so that no zombie is left."""
    pid = os.getpid()
    helper = signal_after_stop(pid, seconds, signal.SIGCONT)
    os.kill(pid, signal.SIGSTOP)
    helper.wait()


def signal_after_stop(pid: int, seconds: float, sig: signal.Signals) -> subprocess.Popen:
    """Start a helper, in a session of its own, that waits until process
    ``pid`` is stopped (its state in ``/proc``, so that a short stop cannot
    race ahead of the ``SIGSTOP`` the caller sends next), then ``seconds``
    more, and sends it ``sig`` (``SIGCONT``: a stop; ``SIGKILL``: a stopped
    process fenced, :mod:`wagma.chaos`).  A process gone before it stopped
    (its job ended) ends the helper too, instead of leaving it polling."""
    return subprocess.Popen(
        [
            "sh",
            "-c",
            f"until grep -q '^State:[[:space:]]*T' /proc/{pid}/status; do "
            f"[ -e /proc/{pid} ] || exit 0; sleep 0.005; done; "
            f"sleep {seconds:.3f}; kill -{sig.name.removeprefix('SIG')} {pid}",
        ],
        start_new_session=True,
    )
