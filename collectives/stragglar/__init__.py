"""StragglAR (Devraj et al.): straggler-aware allreduce schedules, their verifier and cost model."""

from .cost import broadcast_time, rhd_time, ring_time, stragglar_time
from .generator import generate, lower_bound
from .schedule import Schedule, Transfer
from .verify import ScheduleError, verify

__all__ = [
    "Schedule",
    "ScheduleError",
    "Transfer",
    "broadcast_time",
    "generate",
    "lower_bound",
    "rhd_time",
    "ring_time",
    "stragglar_time",
    "verify",
]
