"""Partitioning of a sharded index's items (shards.py): ``id_hash`` places an item by a
hash of its id, ``code_prefix`` by the first ``log2(N)`` bits of its code, which the shard
then drops (a shard of a ``code_prefix`` index holds ``(Q - P)``-bit codes)."""
from __future__ import annotations

import numpy as np

from bucketsearch.index.codes import n_words, pack_bits, unpack_words

PARTITIONINGS = ("id_hash", "code_prefix")
_U64 = np.uint64


def splitmix64(ids: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of every id (uint64): a well-mixed hash for id placement."""
    with np.errstate(over="ignore"):
        z = np.asarray(ids, dtype=np.int64).view(np.uint64) + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def id_shard(ids: np.ndarray, n: int) -> np.ndarray:
    """The shard of each id under ``id_hash``."""
    return (splitmix64(ids) % _U64(n)).astype(np.int64)


def prefix_bits(n: int) -> int:
    """``log2(n)``: the prefix width of ``code_prefix`` (``n`` must be a power of two >= 2)."""
    if n < 2 or n & (n - 1):
        raise ValueError(f"partitioning: code_prefix needs a power-of-two shard count >= 2 "
                         f"(the first log2(N) bits pick the shard), got {n} shards; use "
                         "id_hash or serve with --shards 2, 4, 8, ...")
    return n.bit_length() - 1


def split_prefix(words: np.ndarray, bits: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """``(prefix, suffix_words)``: the first ``p`` bits of each code as an int, and the
    remaining ``bits - p`` bits as ``(bits-p)``-bit codes (words layout of
    :mod:`bucketsearch.index.codes`)."""
    words = np.ascontiguousarray(words, dtype=np.uint64).reshape(-1, n_words(bits))
    if bits <= 64:
        w = words[:, 0]
        rest = bits - p
        prefix = (w >> _U64(rest)).astype(np.int64)
        suffix = (w & _U64((1 << rest) - 1)).reshape(-1, 1)
        return prefix, np.ascontiguousarray(suffix)
    bits01 = unpack_words(words, bits)
    prefix = np.zeros(len(words), dtype=np.int64)
    for j in range(p):
        prefix = (prefix << 1) | bits01[:, j]
    return prefix, pack_bits(np.ascontiguousarray(bits01[:, p:]), bits - p)


def join_prefix(prefix: int, suffix: np.ndarray, bits: int, p: int) -> np.ndarray:
    """The inverse of :func:`split_prefix` for codes of one shard (one ``prefix``)."""
    suffix = np.ascontiguousarray(suffix, dtype=np.uint64).reshape(-1, n_words(bits - p))
    if bits <= 64:
        out = suffix[:, 0] | _U64(prefix << (bits - p))
        return out.reshape(-1, 1)
    head = np.array([(prefix >> (p - 1 - j)) & 1 for j in range(p)], dtype=np.uint8)
    bits01 = np.concatenate([np.broadcast_to(head, (len(suffix), p)),
                             unpack_words(suffix, bits - p)], axis=1)
    return pack_bits(np.ascontiguousarray(bits01), bits)


def popcount_small(x: np.ndarray) -> np.ndarray:
    """Set bits of small non-negative ints (prefixes: at most 8 bits)."""
    x = np.asarray(x, dtype=np.int64)
    out = np.zeros_like(x)
    while x.any():
        out += x & 1
        x = x >> 1
    return out
