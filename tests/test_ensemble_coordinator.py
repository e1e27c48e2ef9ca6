"""ensemble_sync's coordinator on one rank (COMM_SELF): rounds, decisions, the round log, the outages it shows."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from wagma.ensemble_coordinator import (
    ROUND_FIELDS,
    STATUS,
    TAG_DECISION,
    TAG_REPORT,
    Coordinator,
    Decision,
    fault_events,
)


def _decision(answers, deadline_s=10.0):
    """The next decision, or a failure after ``deadline_s`` (never a hang)."""
    buffer, start = np.empty(Decision.width(1)), time.monotonic()
    while not answers.Iprobe(0, TAG_DECISION):
        assert time.monotonic() - start < deadline_s, "no decision came"
        time.sleep(0.001)
    answers.Recv(buffer, source=0, tag=TAG_DECISION)
    return Decision(buffer, 1)


@pytest.mark.timing
def test_a_decision_not_yet_received_is_not_taken_for_the_next_report():
    """Rank 0 is worker and coordinator: its decision may reach it before its
    main thread posts the receive.  Here round 0's decision is left waiting
    (probed, not received) while round 1 is reported: the coordinator must
    answer both.  On a single channel its probe for a report took the
    waiting decision (a truncated receive in its thread, then no answer: a
    hang in 3000 rounds of a 2-rank run)."""
    reports, answers = MPI.COMM_SELF.Dup(), MPI.COMM_SELF.Dup()
    coordinator = Coordinator(reports, answers, timeout=5.0, policy=None, batch_size=16)
    try:
        reports.Send(np.array([0, 5, 80, 0.1, 0.0]), dest=0, tag=TAG_REPORT)
        start = time.monotonic()
        while not answers.Iprobe(0, TAG_DECISION):
            assert time.monotonic() - start < 10, "no decision for round 0"
            time.sleep(0.001)
        reports.Send(np.array([1, 10, 80, 0.1, 1.0]), dest=0, tag=TAG_REPORT)
        first, second = _decision(answers), _decision(answers)
        assert (first.round, first.end_step, first.final) == (0, 5, False)
        assert (second.round, second.end_step, second.final) == (1, 10, True)
        assert first.members == [0] and list(first.shares) == [16]
    finally:
        coordinator.stop()
        reports.Free()
        answers.Free()
    rows = coordinator.rows()
    assert rows.shape == (2, len(ROUND_FIELDS) + 2) and list(rows[:, 0]) == [0, 1]


def test_fault_events_read_a_late_rank_and_a_dead_one_from_the_round_log():
    ranks, width = 3, len(ROUND_FIELDS)
    member, late, joiner, dead = STATUS["member"], STATUS["late"], STATUS["joiner"], STATUS["dead"]
    statuses = [
        (member, member, member),
        (member, late, dead),
        (member, late, dead),
        (member, joiner, dead),
        (member, member, dead),
    ]
    rows = []
    for r, status in enumerate(statuses):
        waited = 1.0 if r == 1 else 0.01
        rows.append([r, 5 * (r + 1), 0, 0, waited, r == 1, r == 4, *status, *([16] * ranks)])
    rows = np.array(rows, dtype=float)
    assert rows.shape[1] == width + 2 * ranks
    assert fault_events(rows, ranks) == [
        {
            "rank": 1,
            "kind": "late",
            "missed_round": 1,
            "missed_step": 10,
            "others_waited_s": 1.0,
            "rejoined_round": 3,
            "rejoined_step": 20,
        },
        {"rank": 2, "kind": "dead", "missed_round": 1, "missed_step": 10, "others_waited_s": pytest.approx(1.0)},
    ]
