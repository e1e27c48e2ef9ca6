"""What a claim's run is given: where to write, how long to run, which launcher."""

import dataclasses
import os

__all__ = ["Context"]


@dataclasses.dataclass(frozen=True)
class Context:
    """One claim's run.

    Args:
        folder: the claim's own folder (run files, benchmark files, figures).
        full: the long version (more ranks, steps or epochs) instead of the bounded default.
        mpiexec: the launcher of the MPI jobs (:func:`experiments.mpirun.find_mpiexec`).
    """

    folder: str
    full: bool
    mpiexec: str

    def path(self, name):
        """``name`` inside the claim's folder (created)."""
        os.makedirs(self.folder, exist_ok=True)
        return os.path.join(self.folder, name)
