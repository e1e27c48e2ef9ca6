"""Datasets by name for the training runs, each rank reading its own equal shard of the training set."""

import copy
import dataclasses
import os
import pickle
from collections.abc import Iterator, Sequence
from typing import Literal, TypeAlias, get_args

import numpy as np
import torch

__all__ = [
    "BOS",
    "DATASETS",
    "DataSpec",
    "Dataset",
    "DatasetName",
    "EOS",
    "PAD",
    "load_dataset",
    "synthetic_cifar",
    "translation",
]

#: Token ids of the sequence tasks (padding, begin and end of sequence); content tokens are 3 and up.
PAD, BOS, EOS = 0, 1, 2

#: Random streams, one per purpose, so that no two draw from the same generator.
_SPLIT, _SHARD, _EPOCH, _TRAIN, _TEST, _TOKEN_MAP, _PROTOTYPES = range(7)

# The per-channel mean and standard deviation of CIFAR-10's 50,000 training images (pixels in [0, 1]).
_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)
_CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)

# Synthetic samples by model: input shape and classes, or None for sequence pairs like ``translation``.
_SYNTHETIC = {
    "mlp": ((64,), 10),
    "resnet20": ((3, 32, 32), 10),
    "resnet18": ((3, 224, 224), 1000),
    "resnet50": ((3, 224, 224), 1000),
    "transformer": None,
    "transformer-base": None,
}


def _rng(seed, stream, *keys):
    """The numpy generator of one purpose (``stream``), seeded by ``seed`` and ``keys``."""
    return np.random.default_rng([seed, stream, *keys])


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about a dataset.

    Args:
        name: the dataset's registry name.
        task: ``"classification"`` (batches ``(x, y)``) or ``"seq2seq"``
            (batches ``(src, tgt)`` of token ids, padded with ``PAD``).
        input_shape: one sample's shape; for seq2seq ``(L,)``, L the longest source.
        train_size: samples in the whole training set (all ranks' shards and the remainder).
        test_size: samples in the test set.
        num_classes: classes (classification only).
        vocab_size: tokens, ``PAD``, ``BOS`` and ``EOS`` included (seq2seq only).
    """

    name: str
    task: Literal["classification", "seq2seq"]
    input_shape: tuple[int, ...]
    train_size: int
    test_size: int
    num_classes: int | None = None
    vocab_size: int | None = None

    def __post_init__(self):
        if self.task not in ("classification", "seq2seq"):
            raise ValueError(f"task must be 'classification' or 'seq2seq', got {self.task!r}")


#: A batch, ``(x, y)`` of a classification task or ``(src, tgt)`` of a seq2seq one.
Batch: TypeAlias = tuple[torch.Tensor, torch.Tensor]


class Dataset:
    """A training set sharded over ranks and a test set, served in batches of tensors.

    Sharding: the training set is permuted once by ``seed`` and cut into
    ``ranks`` equal contiguous parts (the remainder of ``train_size / ranks``
    is left out); rank ``rank`` trains on part ``rank``.  Each epoch visits
    the shard in an order drawn from ``(seed, rank, epoch)`` and drops the
    last incomplete batch, so every rank takes the same number of steps.

    Subclasses provide the samples: ``_batch(split, indices)`` returns the
    tensors of the samples at ``indices`` of ``"train"`` or ``"test"``.

    Args:
        spec: the dataset's ``DataSpec``.
        seed: seeds the shards and the epoch orders.
        rank: this process's shard, ``0 <= rank < ranks``.
        ranks: the number of shards (processes), ``1 <= ranks <= spec.train_size``.
    """

    def __init__(self, spec: DataSpec, *, seed: int = 0, rank: int = 0, ranks: int = 1) -> None:
        if not 1 <= ranks <= spec.train_size:
            raise ValueError(f"ranks must be in [1, {spec.train_size}] (the training samples), got {ranks}")
        if not 0 <= rank < ranks:
            raise ValueError(f"rank must be in [0, {ranks}), got {rank}")
        self.spec, self.seed, self.rank, self.ranks = spec, seed, rank, ranks
        size = spec.train_size // ranks
        self._shard = _rng(seed, _SHARD).permutation(spec.train_size)[rank * size : (rank + 1) * size]

    def __repr__(self):
        return f"{type(self).__name__}({self.spec.name!r}, seed={self.seed}, rank={self.rank}, ranks={self.ranks})"

    @property
    def train_indices(self) -> np.ndarray:
        """Indices into the training set of this rank's shard (a copy)."""
        return self._shard.copy()

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full batches of ``batch_size`` in one epoch of a shard: the same on every rank."""
        if not 1 <= batch_size <= len(self._shard):
            raise ValueError(
                f"batch_size must be in [1, {len(self._shard)}] (the samples of one rank's shard "
                f"of {self.spec.name!r} over {self.ranks} ranks), got {batch_size}"
            )
        return len(self._shard) // batch_size

    def train_batches(self, epoch: int, batch_size: int, start: int = 0) -> Iterator[Batch]:
        """This rank's batches of epoch ``epoch``, from batch index ``start`` on.

        The order depends only on ``(seed, rank, epoch)``: starting at
        ``start`` gives exactly the batches ``start, start + 1, ...`` of a
        full iteration (to resume a run).
        """
        steps = self.steps_per_epoch(batch_size)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if not 0 <= start <= steps:
            raise ValueError(f"start must be in [0, {steps}] (batches per epoch), got {start}")
        order = _rng(self.seed, _EPOCH, self.rank, epoch).permutation(self._shard)
        for step in range(start, steps):
            yield self._batch("train", order[step * batch_size : (step + 1) * batch_size])

    def shard(self, rank: int) -> "Dataset":
        """This dataset as shard ``rank`` sees it (the same samples, another
        part): the batches a rank that left would have read, for the ranks
        that take them over (:meth:`batch_of_shards`)."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank must be in [0, {self.ranks}), got {rank}")
        view = copy.copy(self)
        size = self.spec.train_size // self.ranks
        view.rank = rank
        view._shard = _rng(self.seed, _SHARD).permutation(self.spec.train_size)[rank * size : (rank + 1) * size]
        return view

    def batch_of_shards(self, parts: Sequence[tuple[int, int, int]], epoch: int, index: int, batch_size: int) -> Batch:
        """One batch made of parts of several shards' batch ``index`` of
        epoch ``epoch``: for each ``(shard, lo, hi)``, the samples ``lo:hi``
        of the batch that shard's rank reads there (:meth:`train_batches`).

        The survivors of a dead rank read its batches this way: each one
        its own batch and a slice of the dead rank's, the slices cutting
        that batch into disjoint parts.  So the global batch stays the same,
        and within an epoch no sample is read twice and none of the dead
        rank's is left out.
        """
        steps = self.steps_per_epoch(batch_size)
        if not 0 <= index < steps:
            raise ValueError(f"index must be in [0, {steps}) (batches per epoch), got {index}")
        chosen = []
        for shard, lo, hi in parts:
            view = self if shard == self.rank else self.shard(shard)
            order = _rng(self.seed, _EPOCH, shard, epoch).permutation(view._shard)
            chosen.append(order[index * batch_size : (index + 1) * batch_size][lo:hi])
        return self._batch("train", np.concatenate(chosen))

    def stream_batch(self, position: int, count: int) -> Batch:
        """``count`` samples of this rank's sample stream from ``position`` on.

        The stream is the rank's epochs one after the other, each in the
        order of :meth:`train_batches` (``(seed, rank, epoch)``) and whole
        (no batch is dropped), so consecutive calls with ``position``
        advanced by ``count`` pass over the shard once per ``len(shard)``
        samples taken, whatever the counts: the data of a rank whose batch
        changes from step to step (reallocation) and that may skip steps (a
        late rank's fast-forward).
        """
        if position < 0 or count < 1:
            raise ValueError(f"position must be >= 0 and count >= 1, got {position} and {count}")
        size = len(self._shard)
        parts = []
        while count:
            epoch, offset = divmod(position, size)
            take = min(count, size - offset)
            order = _rng(self.seed, _EPOCH, self.rank, epoch).permutation(self._shard)
            parts.append(order[offset : offset + take])
            position, count = position + take, count - take
        return self._batch("train", np.concatenate(parts))

    def test_batches(self, batch_size: int, rank: int | None = None, ranks: int | None = None) -> Iterator[Batch]:
        """The test set in order, in batches of ``batch_size`` (the last one may be smaller).

        With ``rank`` and ``ranks``, only part ``rank`` of the test set cut
        into ``ranks`` contiguous parts (sizes differ by at most one), so that
        ranks evaluate in parallel and sum their counts.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if (rank is None) != (ranks is None):
            raise ValueError(f"rank and ranks go together, got rank={rank} and ranks={ranks}")
        if rank is None or ranks is None:  # both (checked above)
            rank, ranks = 0, 1
        if ranks < 1 or not 0 <= rank < ranks:
            raise ValueError(f"rank must be in [0, ranks) and ranks >= 1, got rank={rank} and ranks={ranks}")
        size = self.spec.test_size
        begin, end = rank * size // ranks, (rank + 1) * size // ranks
        for first in range(begin, end, batch_size):
            yield self._batch("test", np.arange(first, min(first + batch_size, end)))

    def _batch(self, split: Literal["train", "test"], indices: np.ndarray) -> Batch:
        raise NotImplementedError


class _ArrayClassification(Dataset):
    """Classification samples held in memory as numpy arrays; ``transform``
    turns a batch of them into a float32 tensor."""

    def __init__(self, spec, train, test, transform, **sharding):
        super().__init__(spec, **sharding)
        self._arrays = {"train": train, "test": test}
        self._transform = transform

    def _batch(self, split, indices):
        x, y = self._arrays[split]
        return self._transform(x[indices]), torch.from_numpy(y[indices].astype(np.int64))


class _SyntheticClassification(Dataset):
    """Random classification samples made when a batch asks for them.

    Sample ``i`` of a split is drawn from its own generator seeded by
    ``(seed, split, i)``: uniform 8-bit values scaled to [-1, 1]
    and a uniform label, so the data is fixed but never held in memory
    (about 0.15 ms per 3x224x224 sample on one core).
    """

    def _batch(self, split, indices):
        stream = _TRAIN if split == "train" else _TEST
        x = np.empty((len(indices), *self.spec.input_shape), dtype=np.uint8)
        y = np.empty(len(indices), dtype=np.int64)
        for row, index in enumerate(indices):
            rng = _rng(self.seed, stream, index)
            x[row] = rng.integers(0, 256, self.spec.input_shape, dtype=np.uint8)
            y[row] = rng.integers(self.spec.num_classes)
        return torch.from_numpy(x).float().div_(127.5).sub_(1.0), torch.from_numpy(y)


class _Seq2Seq(Dataset):
    """Token sequence pairs held in memory, padded to the longest pair of each batch."""

    def __init__(self, spec, train, test, **sharding):
        super().__init__(spec, **sharding)
        self._pairs = {"train": train, "test": test}

    def _batch(self, split, indices):
        src, src_len, tgt, tgt_len = self._pairs[split]
        src_width, tgt_width = src_len[indices].max(), tgt_len[indices].max()
        return (
            torch.from_numpy(src[indices, :src_width].astype(np.int64)),
            torch.from_numpy(tgt[indices, :tgt_width].astype(np.int64)),
        )


def _translation_pairs(rng, token_map, size, min_len, max_len):
    """``size`` random sources of ``min_len`` to ``max_len`` content tokens and
    their targets ``BOS, token_map[reversed source], EOS``, padded with ``PAD``.

    Returns ``(src, src_len, tgt, tgt_len)``: token arrays ``(size, max_len)``
    and ``(size, max_len + 2)`` of ``token_map``'s dtype, and their lengths.
    """
    src_len = rng.integers(min_len, max_len + 1, size)
    position = np.arange(max_len)
    src = rng.integers(3, len(token_map), (size, max_len)).astype(token_map.dtype)
    src[position >= src_len[:, None]] = PAD
    backwards = src_len[:, None] - 1 - position  # where position p of the reversed source is read from
    reversed_src = np.where(backwards >= 0, np.take_along_axis(src, np.maximum(backwards, 0), 1), PAD)
    tgt = np.full((size, max_len + 2), PAD, dtype=token_map.dtype)
    tgt[:, 0] = BOS
    tgt[:, 1:-1] = token_map[reversed_src]
    tgt[np.arange(size), src_len + 1] = EOS
    return src, src_len, tgt, src_len + 2


def translation(
    name: str = "translation",
    *,
    train_size: int = 8192,
    test_size: int = 1024,
    vocab_size: int = 32,
    min_len: int = 4,
    max_len: int = 16,
    seed: int = 0,
    rank: int = 0,
    ranks: int = 1,
) -> Dataset:
    """A synthetic translation task with sentences of varying length.

    A source is ``min_len`` to ``max_len`` (uniform) content tokens drawn
    uniformly from ``3 .. vocab_size - 1``; its target is ``BOS``, the
    source reversed with every token renamed by a fixed permutation of the
    content tokens (drawn from ``seed``), then ``EOS``.  Batches are padded
    with ``PAD`` to their longest pair, so the compute per batch varies as
    with real sentences.  The sets are drawn from ``seed`` (the same on every rank).
    """
    if vocab_size < 4 or not 1 <= min_len <= max_len:
        raise ValueError(
            f"vocab_size must be >= 4 and 1 <= min_len <= max_len, got {vocab_size}, {min_len} and {max_len}"
        )
    token_map = np.arange(vocab_size, dtype=np.min_scalar_type(vocab_size - 1))  # the smallest dtype
    token_map[3:] = 3 + _rng(seed, _TOKEN_MAP).permutation(vocab_size - 3)
    spec = DataSpec(name, "seq2seq", (max_len,), train_size, test_size, vocab_size=vocab_size)
    return _Seq2Seq(
        spec,
        _translation_pairs(_rng(seed, _TRAIN), token_map, train_size, min_len, max_len),
        _translation_pairs(_rng(seed, _TEST), token_map, test_size, min_len, max_len),
        seed=seed,
        rank=rank,
        ranks=ranks,
    )


def _digits(seed, rank, ranks):
    from sklearn.datasets import load_digits  # here: importing scikit-learn takes a second

    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target
    order = _rng(seed, _SPLIT).permutation(len(y))
    test, train = order[: len(y) // 5], order[len(y) // 5 :]
    spec = DataSpec("digits", "classification", (64,), len(train), len(test), num_classes=10)
    return _ArrayClassification(
        spec, (x[train], y[train]), (x[test], y[test]), torch.from_numpy, seed=seed, rank=rank, ranks=ranks
    )


def _cifar_folder(root):
    """The ``cifar-10-batches-py`` folder at or under ``root``."""
    if root is None:
        raise FileNotFoundError(
            "cifar10 needs --data-dir: the folder cifar-10-batches-py (or its parent) "
            f"holding {', '.join(_CIFAR_FILES)}"
        )
    for folder in (root, os.path.join(root, "cifar-10-batches-py")):
        if all(os.path.isfile(os.path.join(folder, name)) for name in _CIFAR_FILES):
            return folder
    raise FileNotFoundError(
        f"--data-dir {root!r} is not the CIFAR-10 python folder cifar-10-batches-py nor its "
        f"parent: it must hold {', '.join(_CIFAR_FILES)}"
    )


def _cifar_batches(folder, names):
    """Pixels ``(N, 3, 32, 32)`` uint8 and labels ``(N,)`` of the pickled CIFAR-10 batch files ``names``."""
    xs, ys = [], []
    for name in names:
        with open(os.path.join(folder, name), "rb") as file:
            batch = pickle.load(file, encoding="bytes")
        xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def _cifar_normalise(pixels):
    """uint8 pixels ``(B, 3, 32, 32)`` to float32, standardised per channel."""
    mean = torch.tensor(_CIFAR_MEAN).view(3, 1, 1)
    std = torch.tensor(_CIFAR_STD).view(3, 1, 1)
    return (torch.from_numpy(pixels).float().div_(255.0) - mean) / std


def _cifar10(root, seed, rank, ranks):
    folder = _cifar_folder(root)
    train, test = _cifar_batches(folder, _CIFAR_FILES[:5]), _cifar_batches(folder, _CIFAR_FILES[5:])
    spec = DataSpec("cifar10", "classification", (3, 32, 32), len(train[1]), len(test[1]), num_classes=10)
    return _ArrayClassification(spec, train, test, _cifar_normalise, seed=seed, rank=rank, ranks=ranks)


def _smooth_fields(rng, count, size, frequency):
    """``count`` random images ``(count, 3, size, size)`` float32, periodic and
    smooth: white noise low-passed by a Gaussian of ``frequency`` cycles per
    image in the Fourier domain, each channel of each image standardised
    (mean 0, variance 1 over its pixels)."""
    fy = np.fft.fftfreq(size) * size
    fx = np.fft.rfftfreq(size) * size
    gain = np.exp(-(fy[:, None] ** 2 + fx[None, :] ** 2) / (2.0 * frequency**2))
    shape = (count, 3, size, size // 2 + 1)
    spectrum = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * gain
    fields = np.fft.irfft2(spectrum, s=(size, size))
    fields -= fields.mean(axis=(2, 3), keepdims=True)
    fields /= fields.std(axis=(2, 3), keepdims=True)
    return fields.astype(np.float32)


def _placed(bank, which, dy, dx, flip):
    """Images ``bank[which]`` mirrored left-right where ``flip``, then
    circularly shifted by ``(dy, dx)`` pixels: one vectorised gather ``(n, 3, H, W)``."""
    size = bank.shape[-1]
    position = np.arange(size)
    rows = (position[None, :] - dy[:, None]) % size
    cols = (position[None, :] - dx[:, None]) % size
    cols = np.where(flip[:, None], size - 1 - cols, cols)
    channel = np.arange(bank.shape[1])
    return bank[
        which[:, None, None, None], channel[None, :, None, None], rows[:, None, :, None], cols[:, None, None, :]
    ]


def _synthetic_cifar_prototypes(seed, classes=10, prototypes=4, frequency=3.0):
    """The prototype bank of ``synthetic_cifar``: ``(classes * prototypes, 3, 32, 32)``
    float32, class ``c``'s prototypes at rows ``c * prototypes`` to ``(c + 1) * prototypes - 1``."""
    return _smooth_fields(_rng(seed, _PROTOTYPES), classes * prototypes, 32, frequency)


def _synthetic_cifar_draws(rng, size, classes, prototypes, shift, label_noise):
    """What makes each of ``size`` samples, drawn from ``rng``: a dict of
    arrays ``(size,)`` (``true``: the class, ``label``: after the flips,
    ``flipped``) and ``(2, size)`` (per placed image, own and other class's:
    ``which``, ``dy``, ``dx``, ``mirror``)."""
    true = rng.integers(classes, size=size)
    other = (true + rng.integers(1, classes, size=size)) % classes  # any class but the sample's own
    which = np.stack([true, other]) * prototypes + rng.integers(prototypes, size=(2, size))
    dy, dx = rng.integers(-shift, shift + 1, size=(2, 2, size))
    mirror = rng.random((2, size)) < 0.5
    flipped = rng.random(size) < label_noise
    label = np.where(flipped, (true + rng.integers(1, classes, size=size)) % classes, true)
    return {"true": true, "label": label, "flipped": flipped, "which": which, "dy": dy, "dx": dx, "mirror": mirror}


class _SyntheticImages(Dataset):
    """The images of ``synthetic_cifar``, made when a batch asks for them.

    The draws (classes, prototypes, shifts, mirrorings, labels) are held
    for every sample; the pixels of a batch are one gather from the
    prototype bank plus each sample's noise, drawn from its own generator
    seeded by ``(seed, split, index)`` (about 50 us a sample on one core),
    so a sample is the same whichever batch it comes in.  A split whose
    images fit in :attr:`KEEP_BYTES` keeps each image once made: epochs
    after the first and every evaluation after the first make none (a
    third of an emulated 64-rank run's time went to making them again).
    """

    #: The most bytes of one split's images kept once made.
    KEEP_BYTES = 256 * 2**20

    def __init__(self, spec, bank, draws, overlap, noise, **sharding):
        super().__init__(spec, **sharding)
        self.bank, self.draws, self.overlap, self.noise = bank, draws, overlap, noise
        sample_bytes = 4 * int(np.prod(spec.input_shape))
        self._made = {
            split: {} if len(self.draws[split]["label"]) * sample_bytes <= self.KEEP_BYTES else None
            for split in ("train", "test")
        }
        # Per channel, a prototype has mean 0 and variance 1 over its pixels
        # (shifts and mirrorings keep both), the two placed prototypes are
        # nearly uncorrelated and the noise is independent: this scale makes
        # the inputs about standard normal per channel, like _cifar_normalise.
        self._scale = np.float32(1.0 / np.sqrt((1.0 - overlap) ** 2 + overlap**2 + noise**2))

    def _batch(self, split, indices):
        labels = torch.from_numpy(self.draws[split]["label"][indices])
        made = self._made[split]
        if made is None:
            return torch.from_numpy(self._images(split, indices)), labels
        wanted = indices.tolist()
        missing = [i for i in dict.fromkeys(wanted) if i not in made]
        if missing:
            made.update(zip(missing, self._images(split, np.array(missing))))
        return torch.from_numpy(np.stack([made[i] for i in wanted])), labels

    def _images(self, split, indices):
        d = self.draws[split]
        x = [
            _placed(
                self.bank, d["which"][i, indices], d["dy"][i, indices], d["dx"][i, indices], d["mirror"][i, indices]
            )
            for i in (0, 1)
        ]
        x = (1.0 - self.overlap) * x[0] + self.overlap * x[1]
        if self.noise:
            stream = _TRAIN if split == "train" else _TEST
            for row, index in enumerate(indices):
                x[row] += self.noise * _rng(self.seed, stream, 1, index).standard_normal(x.shape[1:], np.float32)
        x *= self._scale
        return x


def synthetic_cifar(
    name: str = "synthetic-cifar",
    *,
    train_size: int = 4096,
    test_size: int = 1024,
    prototypes: int = 2,
    frequency: float = 3.0,
    shift: int = 4,
    overlap: float = 0.3,
    noise: float = 0.5,
    label_noise: float = 0.05,
    seed: int = 0,
    rank: int = 0,
    ranks: int = 1,
) -> Dataset:
    """A CIFAR-shaped synthetic image classification task of controlled difficulty.

    Float32 images ``(3, 32, 32)``, 10 classes, made from ``seed`` alone (no
    download, the same on every rank).

    Each class owns ``prototypes`` smooth random colour images: white noise
    low-passed to about ``frequency`` cycles per image (blobs and edges at
    a few scales, for convolutions to find), periodic, each channel
    standardised.  A sample of class ``c`` is one of c's prototypes,
    mirrored left-right with probability 1/2 and shifted circularly by up
    to ``shift`` pixels each way, times ``1 - overlap``; plus a prototype
    of a uniformly drawn other class, mirrored and shifted independently,
    times ``overlap``; plus Gaussian pixel noise of deviation ``noise``;
    all scaled to about unit variance per channel (mean 0).  Then a
    fraction ``label_noise`` of the labels, train and test alike, is
    replaced by a uniformly drawn other class.

    The knobs (difficulty grows with each, except ``frequency``, the scale
    of the structure):

    * ``prototypes``: modes per class (intra-class variety; 1: one
      template per class);
    * ``frequency``: the prototypes' spatial bandwidth, cycles per image;
    * ``shift``: translations up to this many pixels (0 leaves the task
      linear in the pixels; the larger, the further a linear model of the
      pixels falls below a translation-invariant one);
    * ``overlap``: the weight of the other class's image (class overlap;
      below 0.5 the sample's own class dominates);
    * ``noise``: the pixel noise against the unit-variance prototypes;
    * ``label_noise``: the fraction of flipped labels.  It caps any
      classifier's expected test accuracy at ``1 - label_noise`` (95 % by
      default): a flipped test label is never the class the image shows.

    Two baselines at the defaults (``tests/test_synthetic_cifar.py``): a
    matched filter that knows the prototypes (the best circular
    cross-correlation over shifts and mirrorings) scores 95.4 % on the
    test set, the cap, and 100 % of the true classes: the classes are
    separable and the flipped labels are the only irreducible error.  The
    nearest class mean of the pixels, fitted on the whole training set,
    scores 76 % (95 % with ``shift=0``, 43 % with ``shift=8``).  The
    defaults were chosen for ResNet-20 trained for a few dozen steps: on
    8 ranks, batch 16 per rank, learning rate 0.2, 2 epochs (64 steps),
    Allreduce-SGD reached 63 % (seed 0) and 39 % (seed 1), between chance
    and the cap; that short a run ends on the steep part of the learning
    curve, so the seed-to-seed spread is large (docs/training.md).

    Args:
        name: the ``DataSpec`` name.
        train_size: training samples (all ranks' shards).
        test_size: test samples.
        prototypes, frequency, shift, overlap, noise, label_noise: above.
        seed: the prototypes, both sets, the shards and the epoch orders.
        rank: this process's shard, ``0 <= rank < ranks``.
        ranks: the number of shards.

    Raises:
        ValueError: a knob or size out of its range.
    """
    if train_size < 1 or test_size < 1 or prototypes < 1:
        raise ValueError(
            f"train_size, test_size and prototypes must be >= 1, got {train_size}, {test_size} and {prototypes}"
        )
    if frequency <= 0 or not 0 <= shift <= 16:
        raise ValueError(f"frequency must be > 0 and shift in [0, 16], got {frequency} and {shift}")
    if not 0 <= overlap <= 1 or noise < 0 or not 0 <= label_noise <= 1:
        raise ValueError(
            f"overlap must be in [0, 1], noise >= 0 and label_noise in [0, 1], got {overlap}, {noise} and {label_noise}"
        )
    classes = 10
    bank = _synthetic_cifar_prototypes(seed, classes, prototypes, frequency)
    draws = {
        split: _synthetic_cifar_draws(_rng(seed, stream, 0), size, classes, prototypes, shift, label_noise)
        for split, stream, size in (("train", _TRAIN, train_size), ("test", _TEST, test_size))
    }
    spec = DataSpec(name, "classification", (3, 32, 32), train_size, test_size, num_classes=classes)
    return _SyntheticImages(spec, bank, draws, overlap, noise, seed=seed, rank=rank, ranks=ranks)


def _synthetic(model, synthetic_size, seed, rank, ranks):
    if model not in _SYNTHETIC:
        raise ValueError(
            f"dataset 'synthetic' needs model to be one of {', '.join(map(repr, _SYNTHETIC))}, got {model!r}"
        )
    shape = _SYNTHETIC[model]
    if synthetic_size is None:
        synthetic_size = 256 if shape is not None and len(shape[0]) == 3 else 2048
    if synthetic_size < 1:
        raise ValueError(f"synthetic_size must be >= 1, got {synthetic_size}")
    if shape is None:
        return translation(
            "synthetic", train_size=synthetic_size * ranks, test_size=synthetic_size, seed=seed, rank=rank, ranks=ranks
        )
    spec = DataSpec(
        "synthetic", "classification", shape[0], synthetic_size * ranks, synthetic_size, num_classes=shape[1]
    )
    return _SyntheticClassification(spec, seed=seed, rank=rank, ranks=ranks)


#: Dataset names ``load_dataset`` accepts.
DatasetName = Literal["digits", "cifar10", "synthetic", "synthetic-cifar", "translation"]
#: The values of :data:`DatasetName`, in its order.
DATASETS: tuple[DatasetName, ...] = get_args(DatasetName)


def load_dataset(
    name: DatasetName,
    *,
    model: str | None = None,
    root: str | os.PathLike[str] | None = None,
    seed: int = 0,
    rank: int = 0,
    ranks: int = 1,
    synthetic_size: int | None = None,
) -> Dataset:
    """Rank ``rank``'s view of dataset ``name``, its training set sharded over ``ranks``.

    Args:
        name: one of ``DATASETS``:

            * ``digits``: scikit-learn's 8x8 digits (bundled), features / 16
              as float32 ``(64,)``, 10 classes; split 80/20 into train and test by ``seed``.
            * ``cifar10``: CIFAR-10 from ``root``, the python version's folder
              ``cifar-10-batches-py`` or its parent; float32 ``(3, 32, 32)``
              standardised per channel; no augmentation.
            * ``synthetic``: random data shaped for ``model`` (throughput runs):
              ``(64,)`` and 10 classes for mlp, ``(3, 32, 32)`` and 10 for
              resnet20, ``(3, 224, 224)`` and 1000 for resnet18/resnet50,
              sequence pairs like ``translation`` for the transformers.
              Labels are random (nothing to learn).
            * ``synthetic-cifar``: a CIFAR-shaped synthetic image task of
              controlled difficulty (see ``synthetic_cifar``): float32
              ``(3, 32, 32)``, 10 classes, 4096 training and 1024 test
              images, 5 % flipped labels (test accuracy capped at 95 %).
            * ``translation``: a synthetic translation task (see ``translation``):
              8192 training and 1024 test pairs, vocabulary 32, sources 4 to 16 tokens.
        model: the model name ``synthetic`` shapes its data for; unused otherwise.
        root: the data folder (``cifar10`` only).
        seed: seeds the split, the shards, the epoch orders and synthetic data.
        rank: this process's shard, ``0 <= rank < ranks``.
        ranks: the number of shards.
        synthetic_size: ``synthetic`` samples per rank (the training set holds
            ``synthetic_size * ranks``, the test set ``synthetic_size``);
            default 256 for images, 2048 otherwise.

    Raises:
        ValueError: an unknown name, ``synthetic`` without a model it knows,
            or a bad rank, ranks or synthetic_size.
        FileNotFoundError: ``cifar10`` without its files under ``root``.
    """
    sharding = {"seed": seed, "rank": rank, "ranks": ranks}
    if name == "digits":
        return _digits(**sharding)
    if name == "cifar10":
        return _cifar10(root, **sharding)
    if name == "synthetic":
        return _synthetic(model, synthetic_size, **sharding)
    if name == "synthetic-cifar":
        return synthetic_cifar(seed=seed, rank=rank, ranks=ranks)
    if name == "translation":
        return translation(seed=seed, rank=rank, ranks=ranks)
    raise ValueError(f"dataset must be one of {', '.join(map(repr, DATASETS))}, got {name!r}")
