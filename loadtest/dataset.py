"""The embedded data set of the load test: clustered binary codes, generated deterministically.

Near-duplicate clusters from :func:`bucketsearch.index.evaluation.synth.clustered_codes`: ``ceil(n /
cluster_size)`` uniform random centres, each code a centre with every bit flipped independently with
probability ``FLIP_P`` (about 2 flips per 64-bit code). Codes of one cluster are a few bits
apart, codes of different clusters about ``bits / 2``: radius 0..3 queries find their source
code and a few neighbours while the probed buckets grow as ``sum C(Q, r)``, nearly all empty.

Codes are returned packed as ``np.packbits`` rows, ``(n, ceil(bits / 8))`` uint8 (the layout of
:mod:`bucketsearch.index.codes`); ids are ``0 .. n-1``.
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.codes import check_bits, to_packed
from bucketsearch.index.synth import clustered_codes as _clustered_words

DEFAULT_N = 1_000_000
DEFAULT_BITS = 64
DEFAULT_SEED = 20240607
DEFAULT_CLUSTER_SIZE = 8
FLIP_P = 1 / 32


def clustered_codes(n: int = DEFAULT_N, bits: int = DEFAULT_BITS, seed: int = DEFAULT_SEED,
                    cluster_size: int = DEFAULT_CLUSTER_SIZE) -> np.ndarray:
    """``(n, ceil(bits/8))`` uint8 packed codes, deterministic in its four arguments."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if cluster_size < 1:
        raise ValueError(f"cluster_size must be >= 1, got {cluster_size}")
    bits = check_bits(bits)
    words = _clustered_words(n, bits, n_clusters=-(-n // cluster_size), flip=FLIP_P, seed=seed)
    return to_packed(words, bits)


def to_hex(packed: np.ndarray) -> list[str]:
    """Packed rows -> hex strings (``bytes.hex`` of each row)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    step = 2 * packed.shape[1]
    blob = packed.tobytes().hex()
    return [blob[i:i + step] for i in range(0, len(blob), step)]
