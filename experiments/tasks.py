"""The loss and the correct predictions of a model on one batch, by task."""

import torch.nn.functional as F

from wagma.datasets import PAD

__all__ = ["loss_and_correct"]


def loss_and_correct(model, batch, spec):
    """The mean loss of ``model`` on ``batch`` and its correct predictions.

    * classification, ``batch = (x, y)``: cross-entropy of ``model(x)``
      against ``y``; a sample is correct when its largest logit is its label.
    * seq2seq, ``batch = (src, tgt)`` with ``tgt = BOS ... EOS`` padded with
      ``PAD``: teacher forcing, ``model(src, tgt[:, :-1])`` predicts
      ``tgt[:, 1:]``; cross-entropy and token accuracy over the non-PAD targets.

    Args:
        model: maps the batch's inputs to logits.
        batch: tensors on the model's device.
        spec: the dataset's ``DataSpec`` (its ``task`` decides).

    Returns:
        ``(loss, n_correct, n_counted)``: the loss, a scalar tensor to call
        ``backward()`` on, is the mean over the ``n_counted`` samples (or
        target tokens); ``n_correct`` and ``n_counted`` are ints, to be summed
        over batches and ranks for an accuracy.
    """
    if spec.task == "classification":
        x, target = batch
        logits = model(x)
        correct = logits.argmax(-1) == target
        return F.cross_entropy(logits, target), int(correct.sum()), target.numel()
    src, tgt = batch
    logits, target = model(src, tgt[:, :-1]), tgt[:, 1:]
    counted = target != PAD
    correct = (logits.argmax(-1) == target) & counted
    return F.cross_entropy(logits.transpose(1, 2), target, ignore_index=PAD), int(correct.sum()), int(counted.sum())
