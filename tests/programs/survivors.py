"""A training loop of one's own whose rank dies mid-run; the survivors go on (ULFM, wagma.membership.survive).

Run by tests/test_survival.py as
``mpiexec --with-ft ulfm -n P python survivors.py OUT_DIR ALGO VICTIM KILL_AT STEPS HOW [OPTIONS_JSON]``.
Every rank trains a small MLP on its own random batches with algorithm
ALGO.  At step KILL_AT rank VICTIM dies (HOW: ``sigkill``, ``sigsegv``, or
``exit``, an ``os._exit`` from inside the step's communication: the
optimizer's post-step hook, where the model-averaging algorithms'
collectives follow at once and the other ranks are already inside them).
A survivor that sees the failure calls ``survive`` and goes on from the
step it returns.  Each survivor writes OUT_DIR/rank-R.json: the membership
changes, its final step, the digest of its final parameters, the sizes of
the communicators, and its parameters' sum.
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

out_dir, algo_name, victim, kill_at, steps, how = sys.argv[1:7]
victim, kill_at, steps = int(victim), int(kill_at), int(steps)
options = json.loads(sys.argv[7]) if len(sys.argv) > 7 else {}
world = MPI.COMM_WORLD
rank = world.Get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
algo = create(algo_name, model, optimizer, Communicator(world), **options)
algo.plan(steps, 8)


def die(*_):
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(0)  # a non-zero status hangs prterun under --with-ft ulfm (PRRTE 3); 0 is a death all the same


if rank == victim and how == "exit":
    armed = {"step": kill_at}
    optimizer.register_step_post_hook(lambda *_: die() if algo.steps == armed["step"] else None)
data = torch.Generator().manual_seed(100 + rank)
sizes, step = [], 0
while step < steps:
    if rank == victim and step == kill_at and how != "exit":
        die()
    try:
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        algo.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        algo.step()
        step = algo.steps
    except Exception as error:
        change = survive(algo, error, "step")
        step = change.step
    sizes.append(algo.comm.size)
while True:  # close() is collective too: a death it notices is survived, and the rebuilt algorithm closes
    try:
        algo.close()
        break
    except Exception as error:
        survive(algo, error, "between steps")
digest = zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
report = {
    "rank": rank,
    "steps": algo.steps,
    "changes": [c.as_dict() for c in algo.membership.changes],
    "digest": digest,
    "sizes": sizes,
    "sum": float(sum(p.detach().double().sum() for p in model.parameters())),
    "dead": sorted(algo.dead_ranks),
}
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(report, f)
