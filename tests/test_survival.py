"""Every algorithm survives a dead rank, rank 0 included (Open MPI's ULFM, wagma.membership.survive).

One 4-rank job per algorithm (tests/programs/survivors.py, a training loop of
one's own): a rank dies at step 5 of 20 (a real SIGKILL, SIGSEGV or
``os._exit`` from inside the step's communication), and the three survivors
must finish every step, agree on the membership change, and hold equal
models where the algorithm says they do.  Between them the jobs cover every
algorithm once, rank 0 twice (the source of Allreduce-SGD's replicas and
ensemble_sync's coordinator) and every kind of death; the victims of the
others are drawn from a seeded generator.  The whole matrix (4 and 6 ranks,
every rank and kind) is scripts/survival-matrix's, recorded in
results/survival/.

Runs where the launcher at hand is Open MPI's (make test-mpi MPI=openmpi, as
CI does); skipped under MPICH, whose wheel has no fault tolerance.
"""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from launcher import mpiexec, mpiexec_command

from experiments.mpirun import launcher_library

PROGRAM = Path(__file__).resolve().parent / "programs" / "survivors.py"
RANKS, KILL_AT, STEPS = 4, 5, 20
_draw = random.Random(36)

#: (algorithm, options, victim, death, the latest step the survivors can go
#: on from, whether their models end equal), with the reasons.  The
#: survivors notice the death at their first operation that needs the dead
#: rank (or on a peer's revocation): in the step it died in or the next for
#: the algorithms that need every rank at every step, later for the others.
CASES = [
    # Gradient averaging: replicas equal after every step; the survivors take the most advanced one's.
    ("allreduce_sgd", {}, 0, "sigkill", KILL_AT + 1, True),
    # A quorum may form without the dead rank: noticed at the limiter's synchronous version (every 4th) at the latest.
    ("eager_sgd", {"limiter": 4}, _draw.randrange(1, RANKS), "exit", KILL_AT + 4, True),
    # Model averaging whose last step (20) is a global average: equal at the end.
    ("local_sgd", {"period": 4}, _draw.randrange(1, RANKS), "sigsegv", KILL_AT + 4, True),
    ("wagma", {"tau": 4}, _draw.randrange(1, RANKS), "sigkill", KILL_AT + 4, True),
    ("hierarchical_sgd", {}, _draw.randrange(1, RANKS), "exit", KILL_AT + 10, True),
    # The last round waits for every living rank: equal at the end; rank 0 is the coordinator.
    ("ensemble_sync", {"period": 4}, 0, "sigsegv", KILL_AT + 4, True),
    # Gossip: the replicas only approach each other.
    ("dpsgd", {}, _draw.randrange(1, RANKS), "sigkill", KILL_AT + 1, False),
    ("sgp", {}, _draw.randrange(1, RANKS), "exit", KILL_AT + 2, False),
    ("adpsgd", {}, _draw.randrange(1, RANKS), "sigkill", KILL_AT + 2, False),
]

pytestmark = [
    pytest.mark.launcher,
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found"),
    pytest.mark.skipif(
        mpiexec() is not None and launcher_library(mpiexec()) != "openmpi",
        reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)",
    ),
]


@pytest.mark.parametrize(
    ("algorithm", "options", "victim", "death", "latest", "equal"), CASES, ids=[c[0] for c in CASES]
)
def test_the_survivors_of_a_dead_rank_finish_every_step(tmp_path, algorithm, options, victim, death, latest, equal):
    job = subprocess.run(
        [
            *mpiexec_command(RANKS, fault_tolerant=True),
            sys.executable,
            str(PROGRAM),
            str(tmp_path),
            algorithm,
            str(victim),
            str(KILL_AT),
            str(STEPS),
            death,
            json.dumps(options),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
    assert sorted(reports) == [r for r in range(RANKS) if r != victim], job.stderr  # every survivor, not the victim
    changes = [report["changes"] for report in reports.values()]
    assert all(c == changes[0] for c in changes)  # one change, the same on every survivor
    (change,) = changes[0]
    assert change["left"] == [victim] and change["ranks_after"] == RANKS - 1
    # The victim died at the start of step KILL_AT or inside it; the survivors
    # go on from the step at which they noticed, or the one after where some
    # of them completed it.
    assert KILL_AT <= change["step"] <= latest, change
    assert change["noticed"] in ("proc_failed", "request_failed", "revoked")
    assert 0 <= change["recovery_s"] < 30, change
    for report in reports.values():
        assert report["steps"] == STEPS and report["dead"] == [victim]
        assert report["sizes"][-1] == RANKS - 1
    digests = {report["digest"] for report in reports.values()}
    if equal:
        assert len(digests) == 1, reports
