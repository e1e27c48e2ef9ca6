"""A training loop of one's own that heals again and again: members die one after another, spares take their rows.

Run by tests/test_healing.py as
``mpiexec --with-ft ulfm -n P+K python spares.py OUT_DIR ALGORITHM OPTIONS_JSON SPARES STEPS KILLS_JSON``
(then, optionally, DIES_WHEN_CALLED and WHEN).
The last SPARES ranks wait (``collectives.spares.SparePool``); the others
train an MLP (16 inputs, 32 hidden units, 4 outputs) on random batches
drawn from their row.  KILLS_JSON lists ``[row, step]``: whoever holds that
row from that step on SIGKILLs itself (a spare that took it, too: a second
generation), each planned death once and in order, a newcomer that joined
past the step at its first step; the survivors go on (``wagma.membership.survive``) and, at
their next step, call a spare for each row that left (``wagma.healing.replace``), which joins
(``wagma.healing.join``).  Every member at the end writes
OUT_DIR/row-R.json (row, steps, rows, changes, parameter digest); every
spare never called writes OUT_DIR/spare-W.json (its world rank) once let go.
The process of world rank DIES_WHEN_CALLED SIGKILLs itself at its first
call: once the communicator that brings the spares in is built (WHEN
``joined``, the default), or before the shrink that builds it (WHEN
``called``: a spare as the call arrives, a member as it calls).  A spare
that dies so must be passed over, the next one called; where a member
dies so, the spares called wait again (a spare whose join failed waits for
its next call) and must be called first next time.
"""

import json
import os
import signal
import sys
import time
import zlib

from mpi4py import MPI

from collectives.failures import any_source
from collectives.spares import _TAG_CALL, SparePool

out_dir, algorithm, options, spare_count, steps, kills = sys.argv[1:7]
options, spare_count, steps, kills = json.loads(options), int(spare_count), int(steps), json.loads(kills)
dies_when_called = int(sys.argv[7]) if len(sys.argv) > 7 else None  # a spare's world rank
when = sys.argv[8] if len(sys.argv) > 8 else "joined"


class Pool(SparePool):
    """The job's pool, where the member of world rank DIES_WHEN_CALLED dies at its first call."""

    def call(self, comm, spares):
        if self.world.rank == dies_when_called and when == "called":
            os.kill(os.getpid(), signal.SIGKILL)
        merged = super().call(comm, spares)
        if self.world.rank == dies_when_called:
            os.kill(os.getpid(), signal.SIGKILL)
        return merged


pool = Pool(MPI.COMM_WORLD, spare_count)
if MPI.COMM_WORLD.rank == dies_when_called and pool.is_spare and when == "called":
    # Waits for the call as the pool does (its tag), and dies on its arrival, unanswered.
    while not any_source(MPI.COMM_WORLD, MPI.COMM_WORLD.Iprobe, MPI.ANY_SOURCE, _TAG_CALL):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
algo = None
while algo is None:  # a spare waits again where its join failed
    called = pool.wait() if pool.is_spare else None
    if called is not None and MPI.COMM_WORLD.rank == dies_when_called:  # dies while it is brought in
        os.kill(os.getpid(), signal.SIGKILL)
    if pool.is_spare and called is None:  # let go at the end of the run: it never imported torch
        with open(os.path.join(out_dir, f"spare-{MPI.COMM_WORLD.rank}.json"), "w") as f:
            json.dump({"world_rank": MPI.COMM_WORLD.rank, "torch": "torch" in sys.modules}, f)
        sys.exit(0)

    import torch  # a spare imports it only once called

    from collectives import Communicator
    from wagma.algorithms import create
    from wagma.healing import join, replace
    from wagma.membership import survive

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if called is not None:
        try:
            algo, row = join(model, optimizer, spare=called)
        except PermissionError:
            continue
    else:
        algo = create(algorithm, model, optimizer, Communicator(pool.members), **options)
        row = pool.members.rank
algo.plan(steps, 8)
data = torch.Generator().manual_seed(row)
step = first = algo.steps
while step < steps:
    # The row's planned deaths in order, each once: the next is due from its step on (a newcomer that
    # joined past it dies at its first step), so that a death noticed late (AD-PSGD's ranks notice at
    # their next exchange with the dead one) does not skip the next.
    planned = sorted(s for r, s in kills if r == row)
    died = sum(row in change.left for change in algo.membership.changes)
    if died < len(planned) and step >= planned[died] and (called is None or step > first):
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        vacant = algo.membership.rows - len(algo.membership.original_ranks)
        if vacant:  # every row at once: a newcomer starts its loop here, at the survivors' step
            replace(algo, vacant, spares=pool)
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        algo.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        algo.step()
        step = algo.steps
    except Exception as error:
        step = survive(algo, error, "step").step
algo.close()
if algo.comm.rank == 0:
    pool.release()
report = {
    "row": row,
    "world_rank": MPI.COMM_WORLD.rank,
    "steps": algo.steps,
    "rows": algo.membership.original_ranks,
    "changes": [c.as_dict() for c in algo.membership.changes],
    "digest": zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters())),
}
with open(os.path.join(out_dir, f"row-{row}.json"), "w") as f:
    json.dump(report, f)
