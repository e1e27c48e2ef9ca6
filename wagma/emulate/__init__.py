"""The arithmetic of P workers in one process, their timing from a schedule.

Time comes from the timing simulator (:mod:`wagma.sim`), arithmetic from the
algorithms' own update rules: one process holds P replicas (each its own
model and optimizer) and applies, version by version, exactly the
contributions the schedule says were fresh or stale.  Deterministic: the same
schedule, models and gradients give the same replicas bitwise.

* :mod:`wagma.emulate.schedule`: who contributed what to each averaging
  (:class:`~.schedule.Schedule`), from a simulation (:func:`~.schedule.simulated_schedule`) or
  from a measured run's file (:func:`~.schedule.logged_schedule`).
* :mod:`wagma.emulate.emulator`: the replicas and the update rules
  (:class:`~.emulator.Emulator`).
"""

from .emulator import EMULATED, Emulated, Emulator
from .schedule import Schedule, logged_schedule, simulated_schedule

__all__ = ["EMULATED", "Emulated", "Emulator", "Schedule", "logged_schedule", "simulated_schedule"]
