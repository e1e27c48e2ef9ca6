"""Evaluating the averaged model (what decentralized SGD is judged on) and each replica."""

import copy

import numpy as np
import torch

from collectives import allreduce
from wagma.evaluation import averaged_model

from .tasks import loss_and_correct

__all__ = ["Evaluator", "score"]


class Evaluator:
    """Scores the average of the replicas on the test set, in parallel over the ranks.

    The average is :func:`wagma.evaluation.averaged_model` (parameters and
    BatchNorm statistics averaged over the ranks into a second model used
    only for evaluation, on the evaluator's own communicator; the training
    model is never touched).  Each
    rank then scores its contiguous share of the test set and the ranks sum
    (loss x count, correct, count): accuracy and mean loss of the averaged
    model over the whole test set.  Collective.

    Args:
        model: the rank's training model.
        comm: a :class:`~collectives.Communicator` for evaluation only.
        dataset: the run's dataset (``test_batches``, ``spec``).
        batch_size: evaluation batch size.
        lock: the algorithm's :attr:`~wagma.algorithms.Algorithm.lock`,
            held while copying the parameters (AD-PSGD's communication
            thread averages them concurrently).
    """

    def __init__(self, model, comm, dataset, batch_size, lock):
        self.model, self.comm, self.dataset, self.batch_size = model, comm, dataset, batch_size
        self.lock = lock
        self.average = copy.deepcopy(model)

    def averaged(self):
        """Loss and accuracy of the replicas' average on the whole test set."""
        averaged_model(self.model, self.comm, into=self.average, lock=self.lock)
        sums = self._score(self.average, rank=self.comm.rank, ranks=self.comm.size)
        allreduce(sums, comm=self.comm, op="sum")
        loss_sum, correct, count = sums.tolist()
        return loss_sum / max(count, 1), correct / max(count, 1)

    def of_parameters(self, parameters):
        """Loss and accuracy, on the whole test set (local), of the model with
        ``parameters`` (one tensor per model parameter, in order) and this
        rank's buffers: ensemble_sync's ensemble as rank 0 last took part in it."""
        with torch.no_grad(), self.lock:
            for mine, theirs in zip(self.average.parameters(), parameters):
                mine.copy_(theirs)
            for mine, theirs in zip(self.average.buffers(), self.model.buffers()):
                mine.copy_(theirs)
        loss_sum, correct, count = self._score(self.average).tolist()
        return loss_sum / max(count, 1), correct / max(count, 1)

    def replica(self):
        """This rank's own model's accuracy on the whole test set (local)."""
        with self.lock:
            replica = copy.deepcopy(self.model)
        _, correct, count = self._score(replica).tolist()
        return correct / max(count, 1)

    def _score(self, model, rank=None, ranks=None):
        return score(model, self.dataset, self.batch_size, rank, ranks)


def score(model, dataset, batch_size, rank=None, ranks=None) -> np.ndarray:
    """``(loss x count, correct, count)`` of ``model`` (in eval mode, no
    gradients) on the test set of ``dataset``, or on part ``rank`` of
    ``ranks`` of it (:meth:`~wagma.datasets.Dataset.test_batches`)."""
    sums = np.zeros(3)
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    with torch.no_grad():
        for batch in dataset.test_batches(batch_size, rank=rank, ranks=ranks):
            batch = tuple(t.to(device) for t in batch)
            loss, correct, count = loss_and_correct(model, batch, dataset.spec)
            sums += (loss.item() * count, correct, count)
    model.train(training)
    return sums
