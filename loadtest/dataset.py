"""The embedded synthetic data set: clustered binary codes, generated deterministically.

``clustered_codes(n, bits, seed)`` draws ``n_centers = ceil(n / cluster_size)`` uniform random
centers and gives every code a center (uniformly) plus a few flipped bits: the number of flips
``f`` is ``Binomial(max_flips, flip_p)`` (mean 2 for the defaults), the flipped positions are
uniform with replacement (a repeated position flips back, so ``f`` is an upper bound on the
distance to the center). Two codes
of a cluster are therefore a few bits apart, two codes of different clusters about ``bits / 2``
apart: radius 0..3 queries built from a code by flipping at most ``r`` bits find the code itself
and sometimes a few neighbours, while the number of probed buckets grows as ``sum C(Q, r)`` and
almost all of them are empty (1M codes occupy a ``2^-44`` fraction of a 64-bit space).

Codes are returned packed as ``np.packbits`` rows, ``(n, ceil(bits / 8))`` uint8 (the layout of
:mod:`index.codes`); ``ids`` are ``0 .. n-1``.
"""
from __future__ import annotations

import numpy as np

DEFAULT_N = 1_000_000
DEFAULT_BITS = 64
DEFAULT_SEED = 20240607
DEFAULT_CLUSTER_SIZE = 8
MAX_FLIPS = 8
FLIP_P = 0.25


def clustered_codes(n: int = DEFAULT_N, bits: int = DEFAULT_BITS, seed: int = DEFAULT_SEED,
                    cluster_size: int = DEFAULT_CLUSTER_SIZE) -> np.ndarray:
    """``(n, ceil(bits/8))`` uint8 packed codes, deterministic in its four arguments."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= bits <= 256:
        raise ValueError(f"bits must be in [1, 256], got {bits}")
    if cluster_size < 1:
        raise ValueError(f"cluster_size must be >= 1, got {cluster_size}")
    rng = np.random.default_rng(seed)
    n_bytes = (bits + 7) // 8
    n_centers = -(-n // cluster_size)
    centers = rng.integers(0, 256, size=(n_centers, n_bytes), dtype=np.uint8)
    if bits % 8:
        centers[:, -1] &= np.uint8((0xFF << (8 - bits % 8)) & 0xFF)
    which = rng.integers(0, n_centers, size=n)
    codes = centers[which]
    flips = rng.binomial(MAX_FLIPS, FLIP_P, size=n)
    positions = rng.integers(0, bits, size=(n, MAX_FLIPS))
    rows = np.arange(n)
    for j in range(MAX_FLIPS):
        active = rows[flips > j]
        pos = positions[active, j]
        codes[active, pos // 8] ^= np.uint8(0x80) >> (pos % 8).astype(np.uint8)
    return np.ascontiguousarray(codes)


def to_hex(packed: np.ndarray) -> list[str]:
    """Packed rows -> hex strings (``bytes.hex`` of each row)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    width = packed.shape[1]
    blob = packed.tobytes().hex()
    step = 2 * width
    return [blob[i:i + step] for i in range(0, len(blob), step)]
