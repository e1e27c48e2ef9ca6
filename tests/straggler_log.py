"""The straggler predictor's rule replayed over a synchronization log (collectives.stragglar.training_sync)."""

import numpy as np

from collectives.stragglar.prediction import StragglerPredictor

__all__ = ["replayed_predictions"]


def replayed_predictions(log, ranks):
    """The straggler each synchronization of ``log`` was due to plan for,
    replayed from what the log recorded of the ones before it; -1 for none.

    ``log`` holds PredictedStragglerSync's rows ``(sync, predicted, last,
    lead_s, min_lead_s)``.  The prediction is a deterministic function of
    each earlier synchronization's last rank and lead and of the gate in
    force after it (collectives.stragglar.prediction), all of which the log
    holds, so a run's predicted column must equal the replay exactly,
    whatever the timing was (a synchronization that ran the fallback for
    want of a plan logs -1 instead).  Each row reaches a fresh predictor as
    an arrival vector with that last rank and lead: the last rank at
    ``lead``, one other rank at 0 (after it, so that a tie, lead 0, still
    goes to the last), the rest at -1.
    """
    predictor, planned = StragglerPredictor(ranks), []
    for _, _, last, lead, gate in np.asarray(log, dtype=np.float64).reshape(-1, 5):
        last = int(last)
        arrivals = np.full(ranks, -1.0)
        if ranks > 1:
            arrivals[last + 1 if last + 1 < ranks else 0] = 0.0
        arrivals[last] = lead
        predictor.min_lead_s = gate
        before, *_ = predictor.observe(arrivals)
        planned.append(before)
    return np.array(planned)
