"""All-or-nothing writes across shards (shards.py): the ingress's intent record.

A sharded write (add, upsert, delete) touches several shards, each with a write-ahead log of
its own; a shard can fsync its part and die before it answers. The ingress makes the write
atomic with an undo log of its own, written ahead of the change (the before-images of an
UNDO log), and treats a record still there at recovery as aborted (the "presumed abort" of
Mohan, Lindsay & Obermarck, "Transaction Management in the R* Distributed Database
Management System", ACM TODS 1986), without changing the shards' logs:

1. under the index's write lock, read the **before-image** of every id of the write (is it
   live, with which code: one ``get`` per shard involved);
2. write the **intent** ``<index>/write.pending`` (:func:`write_intent`: the operation, the
   shards it touches, the ids and their before-images; temp file, fsync, rename, directory
   fsync);
3. send every shard its part, in parallel (each fsyncs its own log record);
4. every part answered: **commit** = remove the intent (unlink, directory fsync), then answer
   200. Anything else (a shard down, dead after its fsync, an engine error, a failed commit):
   **abort** = restore the before-image of every id on every shard the write touched
   (idempotent: delete what must be absent, upsert the old code of what was live), then
   remove the intent, then answer the error.

The intent on disk means "undecided, roll back": at open (a restarted ingress) it is undone
before the index serves. An undo that cannot finish (a shard still down) keeps it pending in
memory too: every read and write of the index first finishes the undo, and answers 503 while
it cannot. So a write answered with an error is absent on every shard before any shard serves
a read again, whatever the moment of the crash, and a write answered 200 was fsynced by every
shard and its intent removed first.

The record is an uncompressed ``.npz`` (read with ``allow_pickle=False``; every member carries
its zip CRC-32): ``meta`` (JSON as bytes: version, op, shards, write sequence number), ``ids``
(int64), ``found`` (bool per id: live before the write), ``words`` (uint64, the full codes of
the found ids only).
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bucketsearch.index.codes import n_words
from bucketsearch.index.disk import fsio
from bucketsearch.index.storage.layout import INTENT_FILE

INTENT_VERSION = 1
OPS = ("add", "upsert", "delete")


@dataclass(frozen=True)
class Intent:
    """One sharded write's undo record: ``ids`` and, for each, whether it was live before
    (``found``) and with which full code (``words``: rows of the found ids only, in order);
    ``shards``: every shard the write sends a part to."""

    op: str
    seq: int
    shards: tuple[int, ...]
    ids: np.ndarray
    found: np.ndarray
    words: np.ndarray


def encode(intent: Intent) -> bytes:
    meta = {"version": INTENT_VERSION, "op": intent.op, "seq": int(intent.seq),
            "shards": [int(s) for s in intent.shards]}
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
             ids=np.ascontiguousarray(intent.ids, dtype=np.int64),
             found=np.ascontiguousarray(intent.found, dtype=bool),
             words=np.ascontiguousarray(intent.words, dtype=np.uint64))
    return buf.getvalue()


def decode(data: bytes, path, n_shards: int, bits: int) -> Intent:
    """The intent in ``data``; ValueError naming ``path`` and the field when it is not one
    this version wrote (a damaged record: which ids the write touched is unknown)."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: unreadable pending sharded write ({what}); it is the undo "
                          f"record of an unfinished write: restore the index from a backup, "
                          f"or remove the file to keep each shard as it is")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("meta", "ids", "found", "words")}
        meta = json.loads(arrays["meta"].tobytes())
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise bad(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("version") != INTENT_VERSION:
        raise bad(f"version must be {INTENT_VERSION}")
    if meta.get("op") not in OPS:
        raise bad(f"op must be one of {OPS}, got {meta.get('op')!r}")
    shards = meta.get("shards")
    if not isinstance(shards, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < n_shards
            for s in shards):
        raise bad(f"shards must be a list of shard numbers in [0, {n_shards - 1}]")
    seq = meta.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise bad("seq must be an integer")
    ids, found, words = arrays["ids"], arrays["found"], arrays["words"]
    if ids.dtype != np.int64 or ids.ndim != 1 or (len(ids) and ids.min() < 0):
        raise bad("ids must be a list of int64 ids >= 0")
    if found.dtype != bool or found.shape != ids.shape:
        raise bad(f"found must be {len(ids)} booleans")
    if words.dtype != np.uint64 or words.shape != (int(found.sum()), n_words(bits)):
        raise bad(f"words must be {int(found.sum())} codes of {bits} bits")
    return Intent(meta["op"], seq, tuple(shards), ids, found, words)


def path_of(folder) -> Path:
    return Path(folder) / INTENT_FILE


def write_intent(folder, intent: Intent) -> None:
    """Durably record ``intent`` before any shard is written (atomic replace)."""
    fsio.replace_file(path_of(folder), encode(intent))


def clear_intent(folder) -> None:
    """Remove the intent durably (the commit of a write, or the end of its undo)."""
    fsio.unlink(path_of(folder))
    fsio.fsync_path(folder)


def read_intent(folder, n_shards: int, bits: int) -> Intent | None:
    """The pending intent of the index in ``folder``, or None."""
    path = path_of(folder)
    try:
        data = fsio.read_bytes(path)
    except FileNotFoundError:
        return None
    return decode(data, path, n_shards, bits)
