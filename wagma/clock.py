"""The training clock: the time axis of every run file (step clocks, evaluation curves, time to accuracy)."""

import time

__all__ = ["TrainingClock"]


class TrainingClock:
    """Seconds of training on this rank since the ranks' common start.

    Definition (one for the whole framework, used by ``experiments.train`` and
    :class:`wagma.step_recorder.StepRecorder`):

    * **Start.** Every rank creates its clock right after the same barrier, so
      all ranks count from the same moment (to the barrier's skew, microseconds).
      A resumed run continues from the clock stored in its checkpoint.
    * **What counts.** Everything a rank does between its steps' starts and
      ends: compute, injected delays, communication, waiting for peers.
    * **What does not.** Evaluations and checkpoints.  They are bracketed by
      :meth:`pause` and :meth:`resume`; while paused the clock *stands still*
      and reads the value it had when paused, and after :meth:`resume` it goes
      on from that value.  So a rank's readings never decrease, whatever a
      pause lasts (a slow first evaluation, a wait for a slower rank inside
      the evaluation's allreduce).
    * **How ranks agree.** Each rank has its own clock.  An evaluation after
      step s is stamped with the maximum over ranks of their clocks when they
      paused for it, i.e. when the slowest rank finished step s: the averaged
      model being evaluated exists only from that moment.  As a maximum of
      non-decreasing per-rank sequences, those stamps are non-decreasing too,
      and strictly increasing when every step takes time.

    The earlier clock read ``perf_counter`` while paused: an evaluation was
    stamped with its own duration so far, which the next resume then removed
    from the clock, so a slow first evaluation could stamp a later time than
    the second one (an evaluation clock going 1.091 s -> 0.847 s).
    """

    def __init__(self, offset: float = 0.0) -> None:
        self._origin = time.perf_counter() - offset
        self._paused_at: float | None = None

    def __call__(self) -> float:
        """Seconds of training so far (the value at the pause while paused)."""
        now = time.perf_counter() if self._paused_at is None else self._paused_at
        return now - self._origin

    @property
    def paused(self) -> bool:
        return self._paused_at is not None

    def pause(self) -> None:
        """Stop counting (before an evaluation or a checkpoint)."""
        if self._paused_at is not None:
            raise RuntimeError("TrainingClock.pause: already paused")
        self._paused_at = time.perf_counter()

    def resume(self) -> None:
        """Count again from the value at the pause."""
        if self._paused_at is None:
            raise RuntimeError("TrainingClock.resume: not paused")
        self._origin += time.perf_counter() - self._paused_at
        self._paused_at = None
