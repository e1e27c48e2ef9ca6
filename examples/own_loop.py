"""A training loop of one's own with any wagma algorithm: a small CNN on scikit-learn's digits.

Run from the repository's root (docs/own-loop.md explains every line):

    .venv/bin/mpiexec -n 4 .venv/bin/python examples/own_loop.py --algo wagma --epochs 3 --out runs/own_loop.h5

What it shows, in the order of a DDP loop: one communicator, the model and
optimizer built as usual (each rank from its own seed: ``create`` makes the
replicas rank 0's), ``create(...)`` with the algorithm's options,
``algo.zero_grad()`` / ``backward()`` / clipping / ``algo.step()``, bf16
autocast with a ``GradScaler`` (``--amp``), ``torch.compile`` (``--compile``),
a checkpoint per epoch that ``--resume`` continues, an injected imbalance,
the averaged model's accuracy, and a run file for ``wagma.analysis``.
"""

import argparse
import ast
import os

import torch
from mpi4py import MPI
from sklearn.datasets import load_digits

from collectives import Communicator
from wagma.algorithms import ALGORITHMS, create
from wagma.evaluation import averaged_model
from wagma.imbalance import Injector
from wagma.step_recorder import StepRecorder


class SmallCNN(torch.nn.Module):
    """Two convolutions with BatchNorm on 8x8 digits, the first one frozen
    with ``--freeze`` (a pretrained stem, say)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.body = torch.nn.Sequential(
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.BatchNorm2d(32),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        )

    def forward(self, x):
        return self.body(self.stem(x))


def shards(rank, ranks, seed):
    """This rank's training shard and the whole test set (digits: 1437 / 360)."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1437], order[1437:]
    mine = train[rank::ranks]
    return (x[mine], y[mine]), (x[test], y[test])


def accuracy(model, data):
    model.eval()
    with torch.no_grad():
        correct = (model(data[0]).argmax(1) == data[1]).float().mean().item()
    model.train()
    return correct


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algo", default="local_sgd", choices=sorted(ALGORITHMS))
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an option of the algorithm, e.g. period=4 or group_size=2 (repeatable)",
    )
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm")
    p.add_argument("--freeze", action="store_true", help="freeze the stem convolution")
    p.add_argument("--amp", action="store_true", help="bf16 autocast with a GradScaler")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--imbalance", default="none", help="e.g. random:k=1,ms=20 (wagma.imbalance.FORMS)")
    p.add_argument("--checkpoint-dir", default=None, help="a checkpoint per epoch, per rank")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    p.add_argument("--out", default="runs/own_loop.h5", help="the run file")
    return p.parse_args()


def main():
    args = parse_args()
    options = {k: ast.literal_eval(v) for k, _, v in (o.partition("=") for o in args.option)}
    torch.set_num_threads(1)
    comm = Communicator(MPI.COMM_WORLD)
    eval_comm = Communicator(MPI.COMM_WORLD)  # evaluation never meets training's messages
    torch.manual_seed(1000 + comm.rank)  # different on purpose: create() broadcasts rank 0's
    model = SmallCNN()
    if args.freeze:
        model.stem.requires_grad_(False)
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=args.lr, momentum=0.9, weight_decay=1e-4
    )
    algo = create(args.algo, model, optimizer, comm, **options)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
    forward = torch.compile(model) if args.compile else model  # after create(): it flattens the model

    epoch0 = 0
    checkpoint = args.checkpoint_dir and os.path.join(args.checkpoint_dir, f"rank{comm.rank}.pt")
    if args.resume and checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint)  # after create(): load_state_dict copies in place
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        algo.load_state_dict(state["algorithm"])
        epoch0 = state["epoch"]

    train, test = shards(comm.rank, comm.size, seed=0)
    steps_per_epoch = len(train[1]) // args.batch_size
    inject = Injector(args.imbalance, comm.rank, comm.size, seed=0)
    average = None
    with StepRecorder(
        algo,
        args.out,
        batch_size=args.batch_size,
        steps_per_epoch=steps_per_epoch,
        steps_planned=steps_per_epoch * args.epochs,
        config=vars(args),
        imbalance=args.imbalance,
        resume_step=epoch0 * steps_per_epoch if epoch0 else None,
    ) as recorder:
        for epoch in range(epoch0, args.epochs):
            order = torch.randperm(len(train[1]), generator=torch.Generator().manual_seed(epoch * 100 + comm.rank))
            for i in range(steps_per_epoch):
                step = epoch * steps_per_epoch + i
                batch = order[i * args.batch_size : (i + 1) * args.batch_size]
                recorder.start_step(delay_s=inject(step))
                algo.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
                    loss = torch.nn.functional.cross_entropy(forward(train[0][batch]), train[1][batch])
                scaler.scale(loss).backward()
                recorder.compute_done()
                if algo.name != "eager_sgd":  # eager-SGD unscales its average inside step()
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                algo.step(scaler)
                scaler.update()
                recorder.end_step(step, loss.item())
            scheduler.step()
            recorder.pause()
            average = averaged_model(model, eval_comm, into=average, lock=algo.lock)
            score = accuracy(average, test)
            recorder.record_eval((epoch + 1) * steps_per_epoch, accuracy=score, loss=float("nan"))
            if comm.rank == 0:
                print(
                    f"epoch {epoch + 1}: loss {loss.item():.3f}, averaged model accuracy {100 * score:.1f} %",
                    flush=True,
                )
            if checkpoint:
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                with algo.lock:  # the model and the algorithm's state at one moment
                    state = {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "algorithm": algo.state_dict(),
                    }
                torch.save(
                    {**state, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch + 1},
                    checkpoint,
                )
            recorder.resume()
    rank = comm.rank
    algo.close()
    eval_comm.close()
    comm.close()
    if rank == 0:
        folder = os.path.dirname(args.out) or "."
        print(f"wrote {args.out}; compare runs with: .venv/bin/python -m wagma.analysis {folder}")


if __name__ == "__main__":
    main()
