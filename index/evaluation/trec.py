"""TREC run and qrels files: our rankings and ground truth in the format trec_eval,
pytrec_eval and ranx read, and qrels read back as a
:class:`~bucketsearch.index.evaluation.relevance.Relevance`.

Run lines: ``qid Q0 docid rank score tag``, query ``q`` named ``q<q>``, database item ``i``
(its row) named ``d<i>``. Each query's items are ranked by (Hamming distance, row), the
order of this project's as-ranked metrics, down to ``depth`` items; the score is
``depth - rank + 1`` (strictly decreasing), because trec_eval re-sorts by score and breaks ties
by docid, which would otherwise reorder items at the same distance. The distance is not lost:
a header comment says all this (``#`` lines: trec_eval, pytrec_eval's ``parse_run`` and ranx
do not skip them, so strip them, ``grep -v '^#' run.txt``, or write with ``header=False``).

Qrels lines: ``qid 0 docid gain`` for every relevant pair (gain 1, or the graded gain rounded
to an int, as qrels hold integers).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bucketsearch.index.metrics.relevance import Relevance, dense, from_pairs


def rankings(db_codes, query_codes, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """``(I, D)`` each ``(nq, min(depth, nb))``: the rows of the ``depth`` first items of every
    query ordered by (distance, row), and their distances (a linear scan, exact)."""
    from bucketsearch.index.evaluation.buckets import bit_array
    from bucketsearch.index.scan import LinearScan

    xb, xq = bit_array(db_codes, "db codes"), bit_array(query_codes, "query codes")
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth must be an int >= 1, got {depth!r}")
    scan = LinearScan(xb.shape[1])
    scan.add(xb)
    D, I = scan.search(xq, int(min(depth, len(xb))))
    return I, D


def write_run(path, db_codes, query_codes, depth: int = 1000, tag: str = "bucketsearch",
              header: bool = True) -> int:
    """Write the ranking as a TREC run (module docstring); returns the number of lines."""
    I, D = rankings(db_codes, query_codes, depth)
    lines = []
    if header:
        lines += [f"# bucketsearch TREC run: items ranked by (Hamming distance, db row), depth "
                  f"{I.shape[1]}; score = depth - rank + 1 keeps that order under trec_eval's "
                  "re-sort", "# columns: qid Q0 docid rank score tag"]
    k = I.shape[1]
    for q in range(len(I)):
        for rank in range(k):
            if I[q, rank] < 0:
                break
            lines.append(f"q{q} Q0 d{I[q, rank]} {rank + 1} {k - rank} {tag}")
    Path(path).write_text("\n".join(lines) + "\n")
    return len(lines)


def write_qrels(path, relevance: Relevance, graded: bool = False) -> int:
    """Write every relevant (query, item) pair as qrels (``qid 0 docid gain``); returns the
    number of lines. Queries are processed in blocks (no nq x nb matrix at once)."""
    out = []
    for s in range(0, relevance.n_queries, 256):
        rows = np.arange(s, min(relevance.n_queries, s + 256))
        g = dense(relevance.subset_queries(rows), graded=graded)
        qi, di = np.nonzero(g)
        gains = np.maximum(1, np.rint(g[qi, di])).astype(np.int64)
        out += [f"q{s + a} 0 d{b} {c}" for a, b, c in zip(qi.tolist(), di.tolist(),
                                                        gains.tolist())]
    Path(path).write_text("\n".join(out) + ("\n" if out else ""))
    return len(out)


def _row(name: str, prefix: str, n: int, what: str, line_no: int) -> int:
    text = name[len(prefix):] if name.startswith(prefix) else name
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"qrels line {line_no}: {what} {name!r} is not {prefix}<row> or a row "
                         "number") from None
    if not 0 <= value < n:
        raise ValueError(f"qrels line {line_no}: {what} {name!r} is out of range [0, {n})")
    return value


def read_qrels(path, n_queries: int, n_db: int) -> Relevance:
    """A qrels file as a :class:`Relevance` (ids ``q<row>``/``d<row>`` or plain rows; pairs
    with relevance <= 0 are not relevant; a pair listed twice is refused)."""
    pairs, gains = [], []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"--qrels: no such file: {path}") from None
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 4:
            raise ValueError(f"qrels line {line_no}: expected 4 columns 'qid 0 docid rel', got "
                             f"{len(parts)}: {line!r}")
        try:
            rel = float(parts[3])
        except ValueError:
            raise ValueError(f"qrels line {line_no}: relevance {parts[3]!r} is not a "
                             "number") from None
        q = _row(parts[0], "q", n_queries, "query id", line_no)
        d = _row(parts[2], "d", n_db, "doc id", line_no)
        if rel > 0:
            pairs.append((q, d))
            gains.append(rel)
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    if len(arr) and len(np.unique(arr[:, 0] * n_db + arr[:, 1])) != len(arr):
        raise ValueError(f"qrels {path}: a (query, doc) pair is listed twice")
    return from_pairs(arr, n_queries, n_db, gains=np.array(gains, dtype=np.float64))
