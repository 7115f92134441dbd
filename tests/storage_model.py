"""The acknowledged state of a live index as a plain dict, and brute force over it.

Shared by tests/test_live_model.py, tests/test_faults.py and tests/test_crash_points.py. The
model never asks the index anything: distances are popcounts of XORed words computed with
``np.unpackbits``, results are ordered by (distance, id), k-NN is padded with -1 (distance -1),
exactly as :class:`bucketsearch.index.storage.live.LiveIndex` promises.

An operation is ``("add" or "upsert", ids, words)`` or ``("delete", ids)``. An operation whose outcome is
unknown (interrupted by a crash, or failed with the log left unrestorable) is *in limbo*: after
the next recovery it may be present or absent, never anything else; :func:`resolve` says which.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from bucketsearch.index.storage import wal
from bucketsearch.index.codes import n_words
from bucketsearch.index.storage.live import LiveIndex

RADII = (0, 1, 2)
KS = (1, 2, 3, 4, 5)


def clustered_pool(bits: int, n: int, seed: int, centers: int = 3, flips: int = 3):
    """``n`` distinct-ish codes (uint64 words) near a few centers: many small distances, ties."""
    rng = np.random.default_rng(seed)
    w = n_words(bits)
    widths = [64] * (w - 1) + [bits - 64 * (w - 1)]
    rows = np.zeros((n, w), dtype=np.uint64)
    base = [[int(rng.integers(0, 2**wd, dtype=np.uint64)) for wd in widths]
            for _ in range(centers)]
    for r in range(n):
        row = list(base[int(rng.integers(0, centers))])
        for _ in range(int(rng.integers(0, flips + 1))):
            j = int(rng.integers(0, bits))
            row[j // 64] ^= 1 << (j % 64)
        rows[r] = row
    return rows


def hamming(xq: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """(nq, nb) Hamming distances: popcount of the XOR, by unpacking every byte."""
    x = np.ascontiguousarray(np.bitwise_xor(xq[:, None, :], xb[None, :, :]))
    return np.unpackbits(x.view(np.uint8), axis=-1).sum(axis=-1, dtype=np.int64)


class Model:
    """id -> code words of every acknowledged, live item."""

    def __init__(self, bits: int, items: dict | None = None):
        self.bits, self.w = bits, n_words(bits)
        self.items: dict[int, tuple] = dict(items or {})

    def copy(self) -> Model:
        return Model(self.bits, self.items)

    def __len__(self) -> int:
        return len(self.items)

    def arrays(self):
        ids = np.array(sorted(self.items), dtype=np.int64)
        words = np.array([self.items[int(i)] for i in ids], dtype=np.uint64).reshape(-1, self.w)
        return ids, words

    def apply(self, op) -> None:
        if op[0] in ("add", "upsert"):
            for i, row in zip(op[1], op[2]):
                assert op[0] == "upsert" or int(i) not in self.items, f"model: add of live id {i}"
                self.items[int(i)] = tuple(int(x) for x in row)
        else:
            for i in op[1]:
                self.items.pop(int(i), None)

    def applied(self, op) -> Model:
        out = self.copy()
        out.apply(op)
        return out

    def range_search(self, xq, radius: int):
        """``lims, D, I``: every item within ``radius`` (inclusive), by (query, distance, id)."""
        ids, words = self.arrays()
        dist = hamming(xq, words)
        q, j = np.nonzero(dist <= radius)
        d = dist[q, j]
        order = np.lexsort((ids[j], d, q))
        lims = np.zeros(len(xq) + 1, dtype=np.int64)
        np.cumsum(np.bincount(q, minlength=len(xq)), out=lims[1:])
        return lims, d[order], ids[j][order]

    def knn(self, xq, k: int):
        """``D, I`` of shape (nq, k): the k nearest by (distance, id), padded with -1."""
        ids, words = self.arrays()
        dist = hamming(xq, words)
        order = np.lexsort((np.broadcast_to(ids, dist.shape), dist), axis=1)[:, :k]
        D = np.full((len(xq), k), -1, dtype=np.int64)
        I = np.full((len(xq), k), -1, dtype=np.int64)
        D[:, :order.shape[1]] = np.take_along_axis(dist, order, axis=1)
        I[:, :order.shape[1]] = ids[order]
        return D, I


def queries(model: Model, extra: np.ndarray) -> np.ndarray:
    """The fixed queries plus every live code (so each item is looked up at radius 0)."""
    _, words = model.arrays()
    return np.ascontiguousarray(np.concatenate([extra, words]).astype(np.uint64))


def differences(live, model: Model, xq, radii=RADII, ks=KS) -> list[str]:
    """Every way the index's answers differ from brute force over the model (empty: equal)."""
    out = []
    if live.ntotal != len(model):
        out.append(f"ntotal {live.ntotal} != {len(model)}")
    for r in radii:
        lims, D, I, _ = live.range_search(xq, r)
        el, ed, ei = model.range_search(xq, r)
        if not (np.array_equal(np.asarray(lims), el) and np.array_equal(np.asarray(I), ei)
                and np.array_equal(np.asarray(D), ed)):
            out.append(f"range r={r}: got lims={np.asarray(lims).tolist()} "
                       f"I={np.asarray(I).tolist()} D={np.asarray(D).tolist()}, expected "
                       f"lims={el.tolist()} I={ei.tolist()} D={ed.tolist()}")
    for k in ks:
        D, I, _ = live.search(xq, k)
        ed, ei = model.knn(xq, k)
        if not (np.array_equal(np.asarray(I), ei) and np.array_equal(np.asarray(D), ed)):
            out.append(f"knn k={k}: got I={np.asarray(I).tolist()} D={np.asarray(D).tolist()}, "
                       f"expected I={ei.tolist()} D={ed.tolist()}")
    return out


def assert_matches(live, model: Model, extra_queries, radii=RADII, ks=KS) -> None:
    diff = differences(live, model, queries(model, extra_queries), radii, ks)
    assert not diff, "index differs from the model:\n  " + "\n  ".join(diff)


def resolve(live, model: Model, limbo: list, extra_queries) -> Model:
    """The model after a recovery: ``model``, or ``model`` plus exactly one operation in limbo
    (an unacknowledged write may survive a crash, at most one, never beside another). Raises
    AssertionError when no candidate matches the index."""
    candidates = [model] + [model.applied(op) for op in limbo if _applicable(model, op)]
    for cand in candidates:
        if not differences(live, cand, queries(cand, extra_queries), radii=(0,), ks=()):
            return cand
    assert_matches(live, model, extra_queries)  # fails with the differences to the model
    return model


def model_op(write: tuple | None):
    """A test case's write (``("add" or "upsert", ids, pool rows)`` or ``("delete", ids)``)
    as a model op."""
    if write is None:
        return None
    if write[0] in ("add", "upsert"):
        return (write[0], np.array(write[1], dtype=np.int64), POOL[write[2]])
    return ("delete", np.array(write[1], dtype=np.int64))


def _applicable(model: Model, op) -> bool:
    return op[0] != "add" or not any(int(i) in model.items for i in op[1])


# ------------------------------------------------------------------ the base scenario
BITS = 16
POOL = clustered_pool(BITS, 40, seed=7)
XQ = POOL[34:]
KW = dict(background_merge=False, merge_threshold=10**6)


def build_base(root: Path, mode: str) -> Model:
    """Two snapshot generations, then a delta with a re-inserted id, tombstones, and a deleted
    delta item: every kind of state a write can meet."""
    live = LiveIndex(root, BITS, mode, **KW)
    model = Model(BITS)

    def add(ids, rows):
        live.add(POOL[rows], ids)
        model.apply(("add", ids, POOL[rows]))

    def delete(ids):
        assert live.delete(ids) == len(ids)
        model.apply(("delete", ids))

    add(list(range(8)), list(range(8)))
    live.merge()
    delete([2])
    add([8, 9, 10, 11], [8, 9, 10, 11])
    live.merge()
    add([12, 13], [12, 13])
    delete([3, 5, 12])
    add([3], [20])  # re-inserted: tombstoned in main, live in the delta
    add([14], [14])
    live.close()
    return model


def plant_torn_tail(directory: Path) -> None:
    """A record cut in the middle at the end of the newest segment (a crash mid-append)."""
    seg = wal.list_segments(directory)[-1][1]
    rec = wal.record(wal.Op("add", np.array([999], dtype=np.int64), POOL[[30]]))
    with open(seg, "ab") as f:
        f.write(rec[: len(rec) // 2])
    (directory / ".snap-00000099.tmp").mkdir()  # an unfinished snapshot to clear away


def snapshots(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if re.fullmatch(r"snap-\d{8}", p.name))


def corrupt_newest_snapshot(directory: Path) -> None:
    newest = snapshots(directory)[-1]
    array = max(newest.rglob("*.npy"), key=lambda p: p.stat().st_size)  # either layout
    raw = bytearray(array.read_bytes())
    raw[-1] ^= 0x01
    array.write_bytes(bytes(raw))
