"""Code files: the formats an insert takes, read from disk into uint64 words.

* ``npy``: a ``.npy`` (detected by its magic bytes) of bits ``(n, Q)`` in {0,1} or {-1,+1},
  packed rows ``(n, ceil(Q/8))`` uint8 (``np.packbits`` layout; padding bits after bit Q - 1
  are cleared) or words ``(n, ceil(Q/64))`` uint64;
* ``packed``: raw packed rows, ``ceil(Q/8)`` bytes a code, nothing else (the file's size a
  multiple of that); taken in ``auto`` for the suffixes of :data:`PACKED_SUFFIXES`;
* ``hex``: a UTF-8 text file of hex codes (``2 ceil(Q/8)`` digits), one per line; blank lines
  and lines starting with ``#`` skipped.

Errors are one ``ValueError`` naming the flag, the file, what it holds and what is allowed.
Used by the load tester's ``--codes`` and ``bucketsearch dedup``.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from bucketsearch.index.codes import as_words, n_bytes, n_words, pack_bytes, pack_hex

FORMATS = ("auto", "npy", "packed", "hex")
PACKED_SUFFIXES = (".bin", ".packed", ".raw", ".u8")
#: what a code file may hold, for error messages
CODE_FORMATS = ("a .npy of bits (n, {bits}) in {{0,1}} or {{-1,+1}} (int or bool), packed rows "
                "(n, {nbytes}) uint8, or words (n, {nwords}) uint64; raw packed rows "
                "({nbytes} bytes a code, suffix .bin); or a text file of hex codes ({ndigits} "
                "digits), one per line")


def allowed_formats(bits: int) -> str:
    return CODE_FORMATS.format(bits=bits, nbytes=n_bytes(bits), nwords=n_words(bits),
                               ndigits=2 * n_bytes(bits))


def read_codes_file(path, bits: int, flag: str = "--codes", fmt: str = "auto") -> np.ndarray:
    """Words ``(n, ceil(bits/64))`` of the codes in ``path`` (see the module docstring)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    path = str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as exc:
        raise ValueError(f"{flag} {path!r}: cannot read the file ({exc.strerror or exc})") \
            from None
    if fmt == "npy" or (fmt == "auto" and head == b"\x93NUMPY"):
        return _read_npy(path, bits, flag)
    if fmt == "packed" or (fmt == "auto" and Path(path).suffix.lower() in PACKED_SUFFIXES):
        return _read_packed(path, bits, flag)
    return _read_hex(path, bits, flag)


def _read_npy(path: str, bits: int, flag: str) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{flag} {path!r}: cannot read the .npy file ({exc})") from None
    what = f"shape {arr.shape} dtype {arr.dtype}"
    if arr.ndim != 2 or not len(arr):
        raise ValueError(f"{flag} {path!r}: {what} is not a non-empty 2-D array of "
                         f"{bits}-bit codes; allowed: {allowed_formats(bits)}")
    if arr.dtype == np.uint8 and arr.shape[1] == n_bytes(bits) != bits and bits % 8:
        arr = arr.copy()  # packed rows: clear the padding bits after bit bits-1
        arr[:, -1] &= np.uint8((0xFF << (8 - bits % 8)) & 0xFF)
    try:
        return as_words(arr, bits)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{flag} {path!r}: {what}: {exc}; allowed: {allowed_formats(bits)}") \
            from None


def _read_packed(path: str, bits: int, flag: str) -> np.ndarray:
    raw = np.fromfile(path, dtype=np.uint8)
    nb = n_bytes(bits)
    if not len(raw) or len(raw) % nb:
        raise ValueError(f"{flag} {path!r}: raw packed codes of {bits} bits take {nb} bytes "
                         f"each, the file holds {len(raw)} bytes (not a positive multiple of "
                         f"{nb}); allowed: {allowed_formats(bits)}")
    try:
        return pack_bytes(raw.reshape(-1, nb), bits)
    except ValueError as exc:
        raise ValueError(f"{flag} {path!r} (raw packed codes): {exc}") from None


def _read_hex(path: str, bits: int, flag: str) -> np.ndarray:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {path!r}: neither a .npy file nor a UTF-8 text file of hex "
                         f"codes (raw packed codes: a {', '.join(PACKED_SUFFIXES)} suffix or "
                         f"the packed format); allowed: {allowed_formats(bits)}") from None
    lines = [(no, line.strip()) for no, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{flag} {path!r}: a text file without any hex code; allowed: "
                         f"{allowed_formats(bits)}")
    try:
        return pack_hex([code for _, code in lines], bits)
    except ValueError as exc:
        msg = re.sub(r"^code (\d+)", lambda m: f"line {lines[int(m.group(1))][0]}", str(exc))
        raise ValueError(f"{flag} {path!r} (text, hex codes of a {bits}-bit index): {msg}; "
                         f"allowed: {allowed_formats(bits)}") from None
