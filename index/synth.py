"""Synthetic code sets, deterministic from a seed (nothing is downloaded).

* ``uniform_codes``: every bit an independent fair coin.
* ``clustered_codes``: ``n_clusters`` random centres; each item is a centre with each bit
  flipped independently with probability ``flip`` (a binomial(Q, flip) distance to its centre),
  the shape of near-duplicate data (SimHash / pHash of re-encoded images).
* ``queries_near``: database codes with ``flips`` random bits flipped, so radius searches find
  items.
All return ``(n, W)`` uint64 words (see :mod:`bucketsearch.index.codes`).
"""
from __future__ import annotations

import numpy as np

from bucketsearch.index.codes import check_bits, n_words, word_widths


def _random_words(rng: np.random.Generator, n: int, bits: int) -> np.ndarray:
    words = rng.integers(0, np.iinfo(np.uint64).max, size=(n, n_words(bits)), dtype=np.uint64,
                         endpoint=True)
    last = word_widths(bits)[-1]
    if last < 64:
        words[:, -1] &= np.uint64((1 << last) - 1)
    return words


def _flip_bits(rng, words, bits, p):
    """Flip each bit independently with probability p."""
    if p <= 0:
        return words
    noise = np.zeros_like(words)
    for w, width in enumerate(word_widths(bits)):
        for b in range(width):
            hit = rng.random(len(words)) < p
            noise[hit, w] |= np.uint64(1) << np.uint64(b)
    return words ^ noise


def uniform_codes(n: int, bits: int, seed: int = 0) -> np.ndarray:
    return _random_words(np.random.default_rng(seed), n, check_bits(bits))


def clustered_codes(n: int, bits: int, n_clusters: int = 1000, flip: float = 0.05,
                    seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = _random_words(rng, n_clusters, check_bits(bits))
    return _flip_bits(rng, centres[rng.integers(0, n_clusters, n)], bits, flip)


def queries_near(words: np.ndarray, nq: int, bits: int, flips: int = 1, seed: int = 1):
    """``nq`` database codes, each with exactly ``flips`` distinct random bits flipped."""
    rng = np.random.default_rng(seed)
    xq = words[rng.integers(0, len(words), nq)].copy()
    for row in xq:
        for j in rng.choice(bits, size=min(flips, bits), replace=False):
            w, width = divmod(int(j), 64)[0], word_widths(bits)[int(j) // 64]
            row[w] ^= np.uint64(1) << np.uint64(width - 1 - int(j) % 64)
    return xq
