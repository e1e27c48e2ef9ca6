"""Training loops of one's own whose ranks die mid-run; the survivors go on (ULFM, wagma.membership.survive).

Run by tests/test_survival.py as
``mpiexec --with-ft ulfm -n P python survivors.py OUT_DIR PHASES_JSON``.
PHASES_JSON is a list of phases ``{"algorithm", "options", "victim",
"kill_at", "steps", "how"[, "hidden"]}`` run one after the other, each on
the survivors of the one before: every rank trains an MLP (16 inputs,
``hidden`` units, default 32, 4 outputs) on its own random batches
with the phase's algorithm, and at step ``kill_at`` the rank ``victim`` (a
rank of the phase's communicator) dies, ``how``: ``sigkill``, ``sigsegv``,
or ``exit``, an ``os._exit`` from inside the step's communication (the
optimizer's post-step hook, where the model-averaging algorithms'
collectives follow at once and the other ranks are already inside them).
A survivor that sees the failure calls ``survive`` and goes on from the
step it returns; ``close()`` is survived the same way.  Each survivor of a
phase writes OUT_DIR/phase-K-rank-R.json (R: its rank in COMM_WORLD): the
membership changes, its final step, the digest of its final parameters, the
sizes of its communicators, the dead ranks (as ranks of the phase's first
communicator, and of COMM_WORLD).
"""

import json
import os
import signal
import sys
import zlib

import torch
from mpi4py import MPI

from collectives import Communicator
from wagma.algorithms import create
from wagma.membership import survive

out_dir, phases = sys.argv[1], json.loads(sys.argv[2])
world = MPI.COMM_WORLD
world_rank = world.Get_rank()
comm = world
world_ranks = list(range(world.Get_size()))  # of each rank of comm


def die(how):
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(0)  # a non-zero status hangs prterun under --with-ft ulfm (PRRTE 3); 0 is a death all the same


for index, phase in enumerate(phases):
    rank, steps, kill_at, how = comm.Get_rank(), phase["steps"], phase["kill_at"], phase["how"]
    victim = rank == phase["victim"]
    torch.manual_seed(index)
    hidden = phase.get("hidden", 32)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    algo = create(phase["algorithm"], model, optimizer, Communicator(comm), **phase["options"])
    algo.plan(steps, 8)
    if victim and how == "exit":
        optimizer.register_step_post_hook(lambda *_: die(how) if algo.steps == kill_at else None)
    data = torch.Generator().manual_seed(100 * index + world_rank)
    sizes, step = [], 0
    while step < steps:
        if victim and step == kill_at and how != "exit":
            die(how)
        try:
            x = torch.randn(8, 16, generator=data)
            y = torch.randint(0, 4, (8,), generator=data)
            algo.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            algo.step()
            step = algo.steps
        except Exception as error:
            step = survive(algo, error, "step").step
        sizes.append(algo.comm.size)
    while True:  # close() is collective too: a death it notices is survived, and the rebuilt algorithm closes
        try:
            algo.close()
            break
        except Exception as error:
            survive(algo, error, "between steps")
    report = {
        "rank": world_rank,
        "steps": algo.steps,
        "changes": [c.as_dict() for c in algo.membership.changes],
        "digest": zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters())),
        "sizes": sizes,
        "dead": sorted(algo.dead_ranks),
        "dead_in_world": sorted(world_ranks[r] for r in algo.dead_ranks),
    }
    with open(os.path.join(out_dir, f"phase-{index}-rank-{world_rank}.json"), "w") as f:
        json.dump(report, f)
    world_ranks = [world_ranks[r] for r in algo.membership.original_ranks]
    comm = algo.membership.comm
