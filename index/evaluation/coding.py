"""Coding strategies that show where metrics disagree (Jiang, Li & Li, section 4).

* :func:`lsh_codes`: random-hyperplane LSH (Charikar 2002): bit j = [w_j . (x - mean) > 0],
  w_j ~ N(0, I), seeded; features centred on the database mean.
* :func:`same_extension` (SE): append s bits equal to 1 to both database and query codes:
  every distance is unchanged (MAP, P and R at every radius unchanged) but the code has Q + s
  bits, so each radius costs more buckets and RAMAP drops.
* :func:`different_extension` (DE): append s bits 0 to database codes and 1 to query codes:
  every distance grows by s (MAP unchanged), and the balls of radius < s are empty, so
  RAMAP@0 = 0.
* :func:`itq` (Gong & Lazebnik, CVPR 2011): PCA to Q dimensions, then an orthogonal rotation
  minimizing the quantization loss by alternating optimization.

Codes are ``(n, Q)`` uint8 arrays of 0/1.
"""
from __future__ import annotations

import numpy as np


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 256:
        raise ValueError(f"bits must be an int in [1, 256], got {bits!r}")
    return int(bits)


def lsh_codes(xb, xq, bits: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random-hyperplane LSH codes (database, queries) of ``bits`` bits."""
    bits = _check_bits(bits)
    xb = np.asarray(xb, dtype=np.float32)
    xq = np.asarray(xq, dtype=np.float32)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((xb.shape[1], bits)).astype(np.float32)
    mu = xb.mean(axis=0)
    return ((xb - mu) @ w > 0).astype(np.uint8), ((xq - mu) @ w > 0).astype(np.uint8)


def _extend(db_codes, q_codes, s: int, db_bit: int, q_bit: int):
    """Append ``s`` bits, ``db_bit`` on the database side and ``q_bit`` on the query side."""
    if s < 0:
        raise ValueError(f"s must be >= 0, got {s}")
    db = np.asarray(db_codes, dtype=np.uint8)
    q = np.asarray(q_codes, dtype=np.uint8)
    return (np.hstack([db, np.full((len(db), s), db_bit, np.uint8)]),
            np.hstack([q, np.full((len(q), s), q_bit, np.uint8)]))


def same_extension(db_codes, q_codes, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``s`` bits equal to 1 on both sides (distances unchanged, Q grows by s)."""
    return _extend(db_codes, q_codes, s, 1, 1)


def different_extension(db_codes, q_codes, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Append ``s`` bits: 0 on the database side, 1 on the query side (distances grow by s)."""
    return _extend(db_codes, q_codes, s, 0, 1)


def pca_basis(xb) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, components)`` of the database features: the eigenvectors of the covariance as
    columns, by decreasing eigenvalue (fit once, reused by :func:`itq` at several code
    lengths)."""
    xb = np.asarray(xb, dtype=np.float64)
    mu = xb.mean(axis=0)
    xc = xb - mu
    evals, evecs = np.linalg.eigh(xc.T @ xc / max(len(xc) - 1, 1))
    return mu, evecs[:, np.argsort(evals)[::-1]]


def itq(xb, xq, bits: int, n_iter: int = 50, seed: int = 0,
        basis: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Iterative quantization: PCA (fit on the database, or the given :func:`pca_basis` of it)
    to ``bits`` dimensions, then ``n_iter`` rounds of B = sign(V R), R = orthogonal Procrustes
    solution of min ||B - V R||."""
    bits = _check_bits(bits)
    xb = np.asarray(xb, dtype=np.float64)
    xq = np.asarray(xq, dtype=np.float64)
    if bits > xb.shape[1]:
        raise ValueError(f"ITQ needs bits <= feature dimension {xb.shape[1]}, got {bits}")
    mu, components = pca_basis(xb) if basis is None else basis
    pca = components[:, :bits]
    v = (xb - mu) @ pca
    rng = np.random.default_rng(seed)
    rot, _ = np.linalg.qr(rng.standard_normal((bits, bits)))
    for _ in range(n_iter):
        b = np.where(v @ rot >= 0, 1.0, -1.0)
        u, _, vt = np.linalg.svd(b.T @ v)
        rot = (u @ vt).T
    return (((v @ rot) >= 0).astype(np.uint8), (((xq - mu) @ pca @ rot) >= 0).astype(np.uint8))
