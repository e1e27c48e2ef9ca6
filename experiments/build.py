"""What ``experiments.train``'s command line builds for one row: its share of the data, and the optimizer."""

import torch

from wagma.datasets import Dataset, load_dataset

__all__ = ["dataset_of", "optimizer_of"]


def dataset_of(args, row: int, rows: int) -> Dataset:
    """Row ``row``'s share of ``--dataset`` in a run of ``rows`` ranks."""
    return load_dataset(
        args.dataset,
        model=args.model,
        root=args.data_dir,
        seed=args.seed,
        rank=row,
        ranks=rows,
        synthetic_size=args.synthetic_size,
    )


def optimizer_of(args, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The local optimizer every rank steps: SGD with ``--lr``, ``--momentum`` and ``--weight-decay``."""
    return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
