"""A training loop of one's own that heals: a rank dies, the survivors go on, then spawn a replacement that joins.

Run by tests/test_healing.py as
``mpiexec --with-ft ulfm -n P python healing.py OUT_DIR ALGORITHM OPTIONS_JSON VICTIM KILL_AT JOIN_AT STEPS``
(then, optionally, IMPOSTOR_AT) with the job's secret in ``$WAGMA_JOB_SECRET``.
Every rank trains an MLP (16 inputs, 32 hidden units, 4 outputs) on random
batches drawn from its row; at step KILL_AT rank VICTIM SIGKILLs itself,
the survivors go on (``wagma.membership.survive``), and at step JOIN_AT
from step JOIN_AT they start one replacement with ``wagma.healing.replace``: this same
program, which finds it was spawned and calls ``wagma.healing.join``
instead of building the algorithm.  Every member at the end, the
replacement included, writes OUT_DIR/row-R.json: its row, steps, the
membership changes, the digest of its parameters and its communicator's
size at every step.  With IMPOSTOR_AT, the survivors first start, from
that step, a replacement that drops the secret from its environment
(``--without-secret``): the job must refuse it, and it writes
OUT_DIR/impostor.json with the refusal it was given.
"""

import json
import os
import signal
import sys
import zlib

import torch
from mpi4py import MPI

from collectives import Communicator
from collectives.admission import SECRET_VARIABLE
from wagma.algorithms import create
from wagma.healing import join, replace
from wagma.membership import survive

out_dir, algorithm, options, victim, kill_at, join_at, steps = sys.argv[1:8]
options, victim, kill_at, join_at, steps = json.loads(options), int(victim), int(kill_at), int(join_at), int(steps)
impostor_at = int(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] != "--without-secret" else None
if sys.argv[-1] == "--without-secret":  # a process that is not the job's: it never had the secret
    os.environ.pop(SECRET_VARIABLE, None)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
healed = MPI.Comm.Get_parent() != MPI.COMM_NULL  # a replacement: the job has healed already
if healed:
    impostor_at = None  # the survivors started it already
    try:
        algo, row = join(model, optimizer)
    except PermissionError as refusal:
        with open(os.path.join(out_dir, "impostor.json"), "w") as f:
            json.dump({"refusal": str(refusal)}, f)
        sys.exit(0)
else:
    algo, row = create(algorithm, model, optimizer, Communicator(MPI.COMM_WORLD), **options), MPI.COMM_WORLD.rank
algo.plan(steps, 8)
data = torch.Generator().manual_seed(row)
sizes, step = [], algo.steps
while step < steps:
    if row == victim and step == kill_at and not healed:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        # The first step from JOIN_AT on that the survivors reach together: where a survivor has not
        # yet noticed the death (a group that did not hold the dead rank), replace's first collective
        # notices it, and the survivors recover and try again at their next step.
        if impostor_at is not None and step >= impostor_at:
            replace(algo, 1, [sys.executable, *sys.argv, "--without-secret"])
            impostor_at = None
        if step >= join_at and not healed:
            replace(algo, 1, [sys.executable, *sys.argv])  # this program, again
            healed = True
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        algo.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        algo.step()
        step = algo.steps
    except Exception as error:
        step = survive(algo, error, "step").step
    sizes.append(algo.comm.size)
algo.close()
report = {
    "row": row,
    "steps": algo.steps,
    "rows": algo.membership.original_ranks,
    "changes": [c.as_dict() for c in algo.membership.changes],
    "digest": zlib.crc32(b"".join(p.detach().numpy().tobytes() for p in model.parameters())),
    "sizes": sizes,
}
with open(os.path.join(out_dir, f"row-{row}.json"), "w") as f:
    json.dump(report, f)
