"""Binary codes: validation and packing into uint64 words.

Bit order (the one convention everything else follows): bit ``j`` of a ``Q``-bit code is column
``j`` of an ``(n, Q)`` bit array, and it is the bit ``np.packbits`` puts first: the most
significant bit of byte ``j // 8``. Packed rows are therefore ``np.packbits(bits, axis=1)``, and a
hex string is the hex of those bytes, ``2 * ceil(Q / 8)`` digits, the first digit holding bits
0-3 (padding bits at the end must be 0).

Words: a code is stored as ``W = ceil(Q / 64)`` uint64 words; word ``w`` holds bits
``64 w .. min(64 w + 64, Q) - 1`` as a binary number read most significant bit first, so for
``Q <= 64`` the single word is the code's integer value ``sum_j b_j 2^(Q-1-j)`` in ``[0, 2^Q)``.
Python ints are read with that same value convention. The Hamming distance of two codes is the
popcount of the XOR of their words.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_BITS = 1
MAX_BITS = 1024
WORD_BITS = 64


def check_bits(bits) -> int:
    """Return ``bits`` as an int after checking ``MIN_BITS <= bits <= MAX_BITS``."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")
    if not MIN_BITS <= int(bits) <= MAX_BITS:
        raise ValueError(f"bits must be in [{MIN_BITS}, {MAX_BITS}], got {bits}")
    return int(bits)


def n_words(bits: int) -> int:
    """Number of uint64 words of a ``bits``-bit code: ``ceil(bits / 64)``."""
    return (check_bits(bits) + WORD_BITS - 1) // WORD_BITS


def n_bytes(bits: int) -> int:
    """Number of bytes of a packed ``bits``-bit code: ``ceil(bits / 8)``."""
    return (check_bits(bits) + 7) // 8


def word_widths(bits: int) -> list[int]:
    """Bits held by each word: 64, 64, ..., and the remainder in the last one."""
    widths = [WORD_BITS] * (bits // WORD_BITS)
    if bits % WORD_BITS:
        widths.append(bits % WORD_BITS)
    return widths


def _bits_to_words(bits01: np.ndarray) -> np.ndarray:
    """(n, Q) array of 0/1 uint8 -> (n, W) uint64 words."""
    n, q = bits01.shape
    out = np.empty((n, n_words(q)), dtype=np.uint64)
    start = 0
    for w, width in enumerate(word_widths(q)):
        chunk = np.zeros((n, WORD_BITS), dtype=np.uint8)
        chunk[:, WORD_BITS - width:] = bits01[:, start:start + width]
        out[:, w] = np.packbits(chunk, axis=1).view(">u8")[:, 0]
        start += width
    return out


def unpack_words(words: np.ndarray, bits: int) -> np.ndarray:
    """(n, W) uint64 words -> (n, Q) uint8 array of 0/1 (the inverse of :func:`pack_bits`)."""
    words = np.ascontiguousarray(words, dtype=np.uint64).reshape(len(words), n_words(bits))
    n = len(words)
    out = np.empty((n, bits), dtype=np.uint8)
    start = 0
    for w, width in enumerate(word_widths(bits)):
        as_bytes = words[:, w].astype(">u8").view(np.uint8).reshape(n, 8)
        out[:, start:start + width] = np.unpackbits(as_bytes, axis=1)[:, WORD_BITS - width:]
        start += width
    return out


def pack_bits(codes, bits: int | None = None) -> np.ndarray:
    """Pack an ``(n, Q)`` array of {0, 1} or {-1, +1} values (any int or bool dtype) to words.

    In the {-1, +1} alphabet, +1 is bit 1 and -1 is bit 0 (the sign of a projection).
    """
    arr = np.asarray(codes)
    if arr.ndim == 1 and arr.size and bits is None:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"codes must be a 2-D (n, Q) array of bits, got shape {arr.shape}")
    if not (arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"codes must have an integer or bool dtype, got {arr.dtype}")
    q = arr.shape[1]
    if bits is not None and check_bits(bits) != q:
        raise ValueError(f"codes have {q} columns but bits={bits}")
    check_bits(q)
    if arr.dtype == np.bool_:
        return _bits_to_words(arr.astype(np.uint8))
    if arr.size and arr.min() < 0:
        bad = ~np.isin(arr, (-1, 1))
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ValueError(f"codes row {row} column {col}: value {arr[row, col]} is outside "
                             "the alphabet {-1, +1} (the array holds negative values)")
        return _bits_to_words((arr > 0).astype(np.uint8))
    bad = arr > 1
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(f"codes row {row} column {col}: value {arr[row, col]} is outside "
                         "the alphabet {0, 1} or {-1, +1}")
    return _bits_to_words(arr.astype(np.uint8))


def pack_bytes(packed, bits: int) -> np.ndarray:
    """Pack ``(n, ceil(Q/8))`` uint8 rows (``np.packbits`` layout) of ``bits``-bit codes to words.

    Padding bits after bit ``Q - 1`` must be 0.
    """
    bits = check_bits(bits)
    arr = np.asarray(packed)
    if arr.ndim == 1:
        arr = arr.reshape(-1, n_bytes(bits)) if arr.size % n_bytes(bits) == 0 else arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != n_bytes(bits):
        raise ValueError(f"packed codes of {bits} bits must have shape (n, {n_bytes(bits)}), "
                         f"got {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"packed codes must be uint8, got {arr.dtype}")
    pad = 8 * n_bytes(bits) - bits
    if pad:
        bad = (arr[:, -1] & np.uint8((1 << pad) - 1)) != 0
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"packed code row {row}: last byte {arr[row, -1]:#04x} has nonzero "
                             f"padding bits (a {bits}-bit code uses only the top "
                             f"{8 - pad} bits of its last byte)")
    if bits % WORD_BITS == 0:
        return np.ascontiguousarray(arr).view(">u8").astype(np.uint64)
    return _bits_to_words(np.unpackbits(arr, axis=1, count=bits))


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _is_hex(text: str) -> bool:
    return _HEX_DIGITS.issuperset(text)


def pack_hex(codes: Sequence[str], bits: int) -> np.ndarray:
    """Pack hex strings (``2 * ceil(Q/8)`` digits each, ``np.packbits`` byte order) to words."""
    bits = check_bits(bits)
    if isinstance(codes, str):
        raise TypeError("codes must be a sequence of hex strings, got a single str")
    width = 2 * n_bytes(bits)
    codes = list(codes)
    try:
        joined = "".join(codes)
        raw = bytes.fromhex(joined) if len(joined) == width * len(codes) else b""
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != n_bytes(bits) * len(codes):  # find the first bad row, for the message
        for row, text in enumerate(codes):
            if not isinstance(text, str):
                raise ValueError(f"code {row}: expected a hex string, got {type(text).__name__}")
            if len(text) != width:
                raise ValueError(f"code {row}: {text[:80]!r} has {len(text)} hex digits, "
                                 f"a {bits}-bit code needs exactly {width}")
            if not _is_hex(text):
                raise ValueError(f"code {row}: {text[:80]!r} is not a hex string "
                                 "(allowed: 0-9, a-f, A-F)")
    arr = np.frombuffer(raw, dtype=np.uint8).reshape(len(codes), n_bytes(bits))
    try:
        return pack_bytes(arr, bits)
    except ValueError as exc:
        raise ValueError(str(exc).replace("packed code row", "code")) from None


def to_packed(words: np.ndarray, bits: int) -> np.ndarray:
    """Words -> ``(n, ceil(Q/8))`` uint8 rows in ``np.packbits`` layout (inverse of pack_bytes)."""
    words = np.ascontiguousarray(words, dtype=np.uint64).reshape(len(words), n_words(bits))
    if bits % 8 == 0 and bits <= WORD_BITS:
        return words[:, 0].astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - bits // 8:].copy()
    if bits % WORD_BITS == 0:
        return words.astype(">u8").view(np.uint8).reshape(len(words), 8 * words.shape[1]).copy()
    return np.packbits(unpack_words(words, bits), axis=1)


def to_hex(words: np.ndarray, bits: int) -> list[str]:
    """Words -> hex strings (inverse of :func:`pack_hex`)."""
    return [row.tobytes().hex() for row in to_packed(words, bits)]


def pack_ints(values: Sequence[int], bits: int) -> np.ndarray:
    """Pack Python ints (the code's value ``sum_j b_j 2^(Q-1-j)``, in ``[0, 2^Q)``) to words."""
    bits = check_bits(bits)
    widths = word_widths(bits)
    out = np.empty((len(values), len(widths)), dtype=np.uint64)
    for row, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"code {row}: expected an int, got {type(value).__name__}")
        value = int(value)
        if not 0 <= value < (1 << bits):
            raise ValueError(f"code {row}: {value} is outside [0, 2^{bits})")
        shift = bits
        for w, width in enumerate(widths):
            shift -= width
            out[row, w] = (value >> shift) & ((1 << width) - 1)
    return out


def to_ints(words: np.ndarray, bits: int) -> list[int]:
    """Words -> Python ints (inverse of :func:`pack_ints`)."""
    widths = word_widths(bits)
    result = []
    for row in np.asarray(words, dtype=np.uint64).reshape(len(words), len(widths)):
        value = 0
        for w, width in enumerate(widths):
            value = (value << width) | int(row[w])
        result.append(value)
    return result


def as_words(codes, bits: int | None = None) -> np.ndarray:
    """Any accepted code format -> ``(n, W)`` C-contiguous uint64 words.

    Accepted: an ``(n, Q)`` bit array ({0,1} or {-1,+1}); ``(n, ceil(Q/8))`` uint8 rows with an
    explicit ``bits`` (when the shape is not ``(n, bits)``); ``(n, W)`` uint64 words with
    ``bits``; a list of hex strings or of Python ints with ``bits``.
    """
    if isinstance(codes, np.ndarray) and codes.dtype == np.uint64:
        if bits is None:
            raise ValueError("uint64 words need an explicit bits")
        words = codes.reshape(len(codes), -1) if codes.ndim == 1 else codes
        if words.ndim != 2 or words.shape[1] != n_words(bits):
            raise ValueError(f"uint64 words of {bits}-bit codes must have shape "
                             f"(n, {n_words(bits)}), got {codes.shape}")
        check_word_range(words, bits)
        return np.ascontiguousarray(words)
    if isinstance(codes, (list, tuple)) and codes and isinstance(codes[0], str):
        if bits is None:
            raise ValueError("hex codes need an explicit bits")
        return pack_hex(codes, bits)
    if isinstance(codes, (list, tuple)) and codes and isinstance(codes[0], (int, np.integer)) \
            and not isinstance(codes[0], bool) and bits is not None and bits > 1:
        return pack_ints(codes, bits)
    arr = np.asarray(codes)
    if bits is not None and arr.dtype == np.uint8 and arr.ndim == 2 \
            and arr.shape[1] == n_bytes(bits) and arr.shape[1] != bits:
        return pack_bytes(arr, bits)
    if arr.ndim == 2 and arr.shape[0] == 0:
        if bits is None:
            bits = arr.shape[1]
        return np.empty((0, n_words(bits)), dtype=np.uint64)
    return pack_bits(arr, bits)


def check_word_range(words: np.ndarray, bits: int) -> None:
    """Reject words with bits set above the code width (the last word's unused high bits)."""
    width = word_widths(bits)[-1]
    if width < WORD_BITS and len(words):
        bad = words[:, -1] >> np.uint64(width) != 0
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"code {row}: word value {int(words[row, -1])} has bits set above "
                             f"bit {width - 1} of a {bits}-bit code")
