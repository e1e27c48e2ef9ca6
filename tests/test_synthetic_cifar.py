"""The synthetic CIFAR-shaped task (``wagma.datasets.synthetic_cifar``), in one process (no MPI)."""

import numpy as np
import pytest

from wagma.datasets import DATASETS, load_dataset, synthetic_cifar


def _arrays(dataset, split, indices):
    x, y = dataset._batch(split, np.asarray(indices))
    return x.numpy(), y.numpy()


def _test_set(dataset):
    xs, ys = zip(*((x.numpy(), y.numpy()) for x, y in dataset.test_batches(512)))
    return np.concatenate(xs), np.concatenate(ys)


@pytest.fixture(scope="module")
def default():
    return load_dataset("synthetic-cifar")


def test_registered_with_its_spec(default):
    assert "synthetic-cifar" in DATASETS
    spec = default.spec
    assert (spec.name, spec.task, spec.input_shape, spec.num_classes) == (
        "synthetic-cifar",
        "classification",
        (3, 32, 32),
        10,
    )
    assert (spec.train_size, spec.test_size) == (4096, 1024)


def test_shapes_dtypes_labels_and_scale(default):
    x, y = next(default.train_batches(0, 64))
    assert x.shape == (64, 3, 32, 32) and str(x.dtype) == "torch.float32"
    assert y.shape == (64,) and str(y.dtype) == "torch.int64"
    x, y = _test_set(default)
    assert x.shape == (1024, 3, 32, 32) and set(np.unique(y)) == set(range(10))
    # Standardised per channel, like _cifar_normalise does for CIFAR-10.
    assert np.allclose(x.mean(axis=(0, 2, 3)), 0.0, atol=0.05)
    assert np.allclose(x.std(axis=(0, 2, 3)), 1.0, atol=0.1)


def test_same_seed_same_bytes_other_seed_other_data(default):
    again = load_dataset("synthetic-cifar", seed=0)
    other = load_dataset("synthetic-cifar", seed=1)
    some = [0, 5, 1023]
    for split in ("train", "test"):
        x, y = _arrays(default, split, some)
        x2, y2 = _arrays(again, split, some)
        assert x.tobytes() == x2.tobytes() and y.tobytes() == y2.tobytes()
        assert not np.array_equal(x, _arrays(other, split, some)[0])


def test_images_kept_once_made_equal_the_ones_made_again(monkeypatch):
    kept = load_dataset("synthetic-cifar", ranks=2)
    monkeypatch.setattr(type(kept), "KEEP_BYTES", 0)
    remade = load_dataset("synthetic-cifar", ranks=2)
    assert remade._made == {"train": None, "test": None}
    # A sample does not depend on the batch it comes in (its noise has its own generator).
    assert np.array_equal(_arrays(remade, "train", [7])[0][0], _arrays(remade, "train", [3, 7])[0][1])
    for epoch in (0, 1):  # epoch 1 of ``kept`` takes every image from what epoch 0 made
        for (x, y), (x2, y2) in zip(kept.train_batches(epoch, 32), remade.train_batches(epoch, 32), strict=True):
            assert x.numpy().tobytes() == x2.numpy().tobytes() and y.equal(y2)
    assert sorted(kept._made["train"]) == sorted(kept.train_indices.tolist())  # its shard only
    for _ in range(2):
        assert all(np.array_equal(a, b) for a, b in zip(_test_set(kept), _test_set(remade)))


def test_rank_views_hold_disjoint_shards_of_the_same_samples(default):
    ranks = 8
    views = [load_dataset("synthetic-cifar", rank=r, ranks=ranks) for r in range(ranks)]
    shards = [view.train_indices for view in views]
    union = np.concatenate(shards)
    assert all(len(shard) == 4096 // ranks for shard in shards)
    assert len(np.unique(union)) == len(union) == 4096
    index = shards[3][0]
    assert np.array_equal(_arrays(views[3], "train", [index])[0], _arrays(views[5], "train", [index])[0])
    assert np.array_equal(_arrays(views[3], "train", [index])[0], _arrays(default, "train", [index])[0])
    assert np.array_equal(_test_set(views[2])[0], _test_set(views[6])[0])


@pytest.mark.parametrize("label_noise", [0.0, 0.05, 0.3])
def test_label_noise_flips_that_fraction_to_other_classes(label_noise):
    dataset = synthetic_cifar(label_noise=label_noise)
    for split in ("train", "test"):
        draws = dataset.draws[split]
        size = len(draws["label"])
        flipped = draws["label"] != draws["true"]
        assert np.array_equal(flipped, draws["flipped"])  # a flip always changes the class
        band = 4 * np.sqrt(label_noise * (1 - label_noise) / size)
        assert abs(flipped.mean() - label_noise) <= band


def _nearest_class_mean(dataset):
    """Test accuracy of the nearest class mean of the pixels, the means from the training set."""
    x, y = _arrays(dataset, "train", np.arange(dataset.spec.train_size))
    x = x.reshape(len(x), -1)
    means = np.stack([x[y == c].mean(axis=0) for c in range(10)])
    tx, ty = _test_set(dataset)
    tx = tx.reshape(len(tx), -1)
    return np.mean((tx @ means.T - 0.5 * (means**2).sum(axis=1)).argmax(axis=1) == ty)


def _matched_filter(dataset, count=512):
    """Test accuracy on the first ``count`` test images of the class of the
    prototype (or its mirror image) with the highest circular cross-correlation
    over all shifts: a translation-invariant classifier that knows the bank."""
    bank = np.concatenate([dataset.bank, dataset.bank[..., ::-1]])
    x, y = _arrays(dataset, "test", np.arange(count))
    spectrum = np.einsum("nchw,pchw->nphw", np.fft.rfft2(x), np.fft.rfft2(bank).conj())
    best = np.fft.irfft2(spectrum, s=(32, 32)).max(axis=(2, 3))  # (count, 2 * classes * prototypes)
    score = best.reshape(count, 2, 10, -1).max(axis=(1, 3))
    return np.mean(score.argmax(axis=1) == y)


def test_learnable_and_translations_make_it_harder(default):
    """At the defaults a translation-invariant matched filter reaches the
    95 % cap that 5 % flipped labels set (the classes are separable), while
    the pixels' nearest class mean stays clearly below it; without shifts
    the class means suffice, with larger ones they fall towards chance."""
    assert 0.9 <= _matched_filter(default) <= 0.98
    assert 0.6 <= _nearest_class_mean(default) <= 0.85
    assert _nearest_class_mean(synthetic_cifar(shift=0)) >= 0.9
    assert _nearest_class_mean(synthetic_cifar(shift=8)) <= 0.55


@pytest.mark.parametrize(
    "knobs",
    [
        dict(prototypes=0),
        dict(frequency=0.0),
        dict(shift=17),
        dict(overlap=1.5),
        dict(noise=-1.0),
        dict(label_noise=2.0),
        dict(train_size=0),
    ],
)
def test_knobs_out_of_range_are_refused(knobs):
    with pytest.raises(ValueError):
        synthetic_cifar(**knobs)
