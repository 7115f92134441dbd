"""Labelled data sets for evaluation: an embedded synthetic one, user files, sklearn digits.

Nothing is downloaded. :func:`synthetic_cifar` generates, deterministically from a seed, a data
set shaped like the CIFAR-10 hashing protocol: 10 classes, 59,000 database items + 1,000
queries (100 per class), 512-D features. Each class is a mixture of a few Gaussian sub-clusters
around a class centre, plus a strong low-rank nuisance component unrelated to the class and
isotropic noise, so classes overlap the way GIST features of CIFAR-10 do: LSH and ITQ reach MAP
values of the same order as on CIFAR-10 (roughly 0.12-0.2), not a separable toy.
"""
from __future__ import annotations

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


def digits(n_queries: int = 200, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 items, 64-D, 10 classes); ``n_queries`` sampled
    as queries. Needs scikit-learn (the ``sklearn`` extra); never downloads."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("the digits data set needs scikit-learn: "
                          "pip install 'bucketsearch[sklearn]'") from None
    data = load_digits()
    x = data.data.astype(np.float32)
    y = data.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(x), size=n_queries, replace=False)
    mask = np.zeros(len(x), dtype=bool)
    mask[pick] = True
    return Dataset("sklearn-digits", x[~mask], y[~mask], x[mask], y[mask])


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


def load(name: str = "synthetic", seed: int = 0, **kwargs) -> Dataset:
    """``"synthetic"`` (embedded), ``"digits"`` (scikit-learn) or a path to a ``.npz``."""
    if name == "synthetic":
        return synthetic_cifar(seed=seed, **kwargs)
    if name == "digits":
        return digits(seed=seed, **kwargs)
    if name.endswith(".npz"):
        return load_npz(name)
    raise ValueError(f"data set must be 'synthetic', 'digits' or a .npz path, got {name!r}")
