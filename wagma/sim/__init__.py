"""Scale simulator: every training algorithm at 16 to 4096 ranks in seconds.

A discrete-step model (:mod:`wagma.sim.kernels`, numba) of T steps on P
ranks: per-step compute times from the imbalance models of the training
entry point (same specs, same seeds, :func:`~wagma.sim.engine.compute_times`),
communication from the alpha-beta model (:mod:`wagma.sim.network`), and each
algorithm's rule of who waits for whom.  Results are runs in the schema of
measured ones (:func:`~wagma.sim.engine.save`), so ``wagma.analysis``
compares simulated and measured files side by side.  With ``sync="stragglar"``
the global synchronizations run StragglAR for the rank the runtime's
predictor (:mod:`collectives.stragglar.prediction`) names from the
simulated arrivals.  CLI:
``python -m wagma.sim`` (docs/simulator.md).
"""

from .engine import ALGORITHMS, Scenario, SimulatedRun, compute_times, save, simulate
from .network import COLLECTIVES, Collective, Network

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "Collective",
    "Network",
    "Scenario",
    "SimulatedRun",
    "compute_times",
    "save",
    "simulate",
]
