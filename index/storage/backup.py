"""The backup file of one index: its live items at one consistent state, self-checking.

Layout (little-endian)::

    b"BSBACKUP"                       magic, 8 bytes
    u32 format version (1), u32 H     H = length of the header
    header                            UTF-8 JSON: bits, mode, substrings, n, words (W), ...
    n x i64 ids, n x W x u64 words    the items, in id order
    u32 crc32                         of every byte before it

A reader checks the magic, the version, the header fields, the length implied by ``n`` and
``W`` and the checksum before it trusts any item, and names the first thing that is wrong.
"""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import orjson

from bucketsearch.index.codes import MAX_BITS, MIN_BITS, check_word_range, n_words
from bucketsearch.index.factory import SERVED_MODES, check_served_mode

MAGIC = b"BSBACKUP"
VERSION = 1
_HEAD = struct.Struct("<II")
_CRC = struct.Struct("<I")


class BackupError(ValueError):
    """A backup file that is truncated, damaged or not a backup at all."""


def dump(meta: dict, ids: np.ndarray, words: np.ndarray) -> bytes:
    """The backup bytes of ``(ids, words)`` (sorted by id here) with ``meta`` (bits, mode,
    substrings, and anything else worth keeping, e.g. the index name)."""
    ids = np.asarray(ids, dtype="<i8")
    order = np.argsort(ids, kind="stable")
    words = np.ascontiguousarray(np.asarray(words, dtype="<u8")[order])
    header = json.dumps({**meta, "n": int(len(ids)), "words": int(words.shape[1])}).encode()
    body = b"".join([MAGIC, _HEAD.pack(VERSION, len(header)), header,
                     np.ascontiguousarray(ids[order]).tobytes(), words.tobytes()])
    return body + _CRC.pack(zlib.crc32(body))


#: The header fields a reader relies on: ``(name, smallest, largest)`` of each integer.
INT_FIELDS = (("bits", MIN_BITS, MAX_BITS), ("n", 0, 2**62), ("words", 1, n_words(MAX_BITS)))


def check_header(meta) -> None:
    """The backup header, field by field (its checksum is valid, so these are what the writer
    wrote, or what someone crafted): a JSON object; ``bits``, ``n``, ``words`` integers in
    range (a JSON ``true`` or ``8.0`` is not an integer); ``mode`` a served mode;
    ``substrings`` null or an integer the mode accepts for ``bits`` (the engine's own rule,
    :func:`bucketsearch.index.factory.check_served_mode`). :class:`BackupError` naming the field."""
    if not isinstance(meta, dict):
        raise BackupError(f"body: the backup's header must be a JSON object, got "
                          f"{type(meta).__name__}")
    for name, low, high in INT_FIELDS:
        value = meta.get(name)
        if type(value) is not int or not low <= value <= high:
            raise BackupError(f"body: the backup's header field {name!r} must be an integer in "
                              f"[{low}, {high}], got {value!r}")
    mode, substrings = meta.get("mode"), meta.get("substrings")
    if mode not in SERVED_MODES:
        raise BackupError(f"body: the backup's header field 'mode' must be one of "
                          f"{', '.join(SERVED_MODES)}, got {mode!r}")
    if substrings is not None and (type(substrings) is not int or substrings < 1):
        raise BackupError(f"body: the backup's header field 'substrings' must be null or an "
                          f"integer >= 1, got {substrings!r}")
    try:
        check_served_mode(mode, meta["bits"], substrings)
    except (ValueError, TypeError) as exc:
        raise BackupError(f"body: the backup's header fields mode={mode!r}, substrings="
                          f"{substrings!r}, bits={meta['bits']} do not make an index: {exc}") \
            from None


def load(data: bytes) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(meta, ids, words)`` of a backup; :class:`BackupError` naming what is wrong."""
    data = memoryview(data)
    fixed = len(MAGIC) + _HEAD.size
    if len(data) < fixed + _CRC.size or bytes(data[:len(MAGIC)]) != MAGIC:
        raise BackupError(f"body: not a bucketsearch backup (it must start with {MAGIC!r}; "
                          f"got {bytes(data[:len(MAGIC)])!r}, {len(data)} bytes)")
    version, hlen = _HEAD.unpack_from(data, len(MAGIC))
    if version != VERSION:
        raise BackupError(f"body: backup format version {version}, this server reads "
                          f"version {VERSION}")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(data[:len(data) - _CRC.size]) != crc:
        raise BackupError("body: the backup's checksum does not match (truncated or damaged "
                          "in transit)")
    try:
        meta = orjson.loads(bytes(data[fixed:fixed + hlen]))  # depth-limited: ValueError
    except ValueError as exc:
        raise BackupError(f"body: the backup's header is not valid JSON ({exc})") from None
    check_header(meta)
    bits, n, w = meta["bits"], meta["n"], meta["words"]
    if w != n_words(bits):
        raise BackupError(f"body: the header says n={n}, words={w} for bits={bits} "
                          f"(words must be {n_words(bits)})")
    start = fixed + hlen
    if len(data) - _CRC.size - start != 8 * n * (1 + w):
        raise BackupError(f"body: {len(data) - _CRC.size - start} bytes of items, the header "
                          f"implies {8 * n * (1 + w)} (n={n}, words={w})")
    ids = np.frombuffer(data, dtype="<i8", count=n, offset=start).astype(np.int64)
    words = np.frombuffer(data, dtype="<u8", count=n * w, offset=start + 8 * n)
    words = words.astype(np.uint64).reshape(n, w)
    if n and (ids.min() < 0 or (np.diff(ids) <= 0).any()):
        raise BackupError("body: the backup's ids are not unique non-negative ids in order")
    try:
        check_word_range(words, bits)
    except ValueError as exc:
        raise BackupError(f"body: {exc}") from None
    return meta, ids, words
