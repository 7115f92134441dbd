"""Server-side snapshots of an index for backup: tar files with checksums.

``POST /v1/indexes/{name}/snapshots`` writes one, ``GET .../snapshots/{snapshot}`` streams it,
``POST /v1/indexes/{new}/restore`` reads it back. A snapshot is a POSIX tar of two members::

    manifest.json     {"format": "bucketsearch-snapshot", "version": 1, "index": name,
                       "bits", "mode", "substrings", "items", "created_at", "bucketsearch",
                       "files": {"index.bsbackup": {"bytes": B, "sha256": H}}}
    index.bsbackup    the backup file of :mod:`bucketsearch.index.storage.backup` (items in id
    order, CRC-32)

so it is checked twice on restore: the SHA-256 of the member against the manifest, then the
backup's own header, lengths and CRC. Snapshots live in ``<index folder>/backups/`` (deleted
with the index), each written atomically (temp file, fsync, rename, fsync of the directory):
a crash leaves the snapshot whole or absent, never half a file under its name, and a
refused request (a storage error) leaves it absent.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tarfile
import time
import uuid
from pathlib import Path

import numpy as np
import orjson

from bucketsearch.index.disk import fsio
from bucketsearch.index.storage import backup
from bucketsearch.index.storage.backup import BackupError
from bucketsearch.index.storage.layout import BACKUPS as DIR

FORMAT, VERSION = "bucketsearch-snapshot", 1
MANIFEST, PAYLOAD = "manifest.json", "index.bsbackup"
#: A snapshot's file name (also the path parameter's pattern in the OpenAPI document).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.tar$"
_NAME_RE = re.compile(NAME_PATTERN)


def is_tar(data) -> bool:
    """Whether ``data`` starts with a POSIX (ustar) tar header."""
    return len(data) >= 512 and bytes(data[257:262]) == b"ustar"


def pack(meta: dict, ids: np.ndarray, words: np.ndarray) -> tuple[bytes, dict]:
    """``(tar bytes, manifest)`` of the items with ``meta`` (index, bits, mode, substrings)."""
    payload = backup.dump(meta, ids, words)
    manifest = {"format": FORMAT, "version": VERSION, **meta, "items": int(len(ids)),
                "files": {PAYLOAD: {"bytes": len(payload),
                                    "sha256": hashlib.sha256(payload).hexdigest()}}}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in ((MANIFEST, json.dumps(manifest, indent=1).encode()),
                           (PAYLOAD, payload)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(meta.get("created_at", 0)), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue(), manifest


def unpack(data) -> tuple[dict, bytes]:
    """``(manifest, backup file)`` of a snapshot tar, after checking the manifest field by
    field and the SHA-256; :class:`BackupError` naming the first thing that is wrong."""
    try:
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            missing = [n for n in (MANIFEST, PAYLOAD) if n not in members]
            if missing:
                raise BackupError(f"body: the snapshot tar lacks {', '.join(missing)} (members: "
                                  f"{sorted(members) or 'none'})")
            manifest = orjson.loads(tar.extractfile(members[MANIFEST]).read())  # depth-limited
            payload = tar.extractfile(members[PAYLOAD]).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BackupError(f"body: not a readable snapshot tar ({exc})") from None
    except ValueError as exc:  # the manifest's JSON
        raise BackupError(f"body: the snapshot's {MANIFEST} is not valid JSON ({exc})") from None
    size, digest = check_manifest(manifest)
    if len(payload) != size or hashlib.sha256(payload).hexdigest() != digest:
        raise BackupError(f"body: the snapshot's {PAYLOAD} does not match its SHA-256 in "
                          f"{MANIFEST} ({len(payload)} bytes, the manifest says {size}): "
                          "damaged or truncated")
    return manifest, payload


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _field_error(field: str, allowed: str, value) -> BackupError:
    return BackupError(f"body: the snapshot's {MANIFEST} field {field!r} must be {allowed}, "
                       f"got {value!r}")


def check_manifest(manifest) -> tuple[int, str]:
    """The manifest, field by field: ``(payload bytes, payload SHA-256)``; :class:`BackupError`
    naming the first field that is missing or of the wrong kind (a JSON ``true`` or ``1.0``
    is not an integer)."""
    if not isinstance(manifest, dict):
        raise BackupError(f"body: the snapshot's {MANIFEST} must be a JSON object, got "
                          f"{type(manifest).__name__}")
    if manifest.get("format") != FORMAT or type(manifest.get("version")) is not int \
            or manifest["version"] != VERSION:
        raise BackupError(f"body: snapshot format {manifest.get('format')!r} version "
                          f"{manifest.get('version')!r}; this server reads {FORMAT!r} "
                          f"version {VERSION}")
    files = manifest.get("files")
    want = files.get(PAYLOAD) if isinstance(files, dict) else None
    if not isinstance(want, dict):
        raise _field_error(f"files.{PAYLOAD}", "an object with 'bytes' and 'sha256'", want)
    size, digest = want.get("bytes"), want.get("sha256")
    if type(size) is not int or size < 0:
        raise _field_error(f"files.{PAYLOAD}.bytes", "an integer >= 0", size)
    if not isinstance(digest, str) or not _SHA256_RE.match(digest):
        raise _field_error(f"files.{PAYLOAD}.sha256", "64 lowercase hex digits", digest)
    items = manifest.get("items")
    if items is not None and (type(items) is not int or items < 0):
        raise _field_error("items", "an integer >= 0", items)
    return size, digest


def load(data) -> tuple[dict, np.ndarray, np.ndarray]:
    """``(meta, ids, words)`` of a restore body (a snapshot tar or a backup file), every
    checksum and every field checked; a snapshot's manifest must agree with the backup inside
    it (``bits``, ``mode``, ``substrings``, ``items``). :class:`BackupError` naming what is
    wrong."""
    if not is_tar(data):
        return backup.load(bytes(data))
    manifest, payload = unpack(data)
    meta, ids, words = backup.load(payload)
    for field, actual in (("bits", meta["bits"]), ("mode", meta["mode"]),
                          ("substrings", meta.get("substrings")), ("items", len(ids))):
        if field in manifest and manifest[field] != actual:
            raise BackupError(f"body: the snapshot's {MANIFEST} says {field}="
                              f"{manifest[field]!r}, its {PAYLOAD} holds {actual!r}")
    return meta, ids, words


def check_name(snapshot: str) -> str:
    """``snapshot`` if it is a snapshot file name (letters, digits, ``._-``, ending ``.tar``,
    no leading dot or slash), else ValueError naming it."""
    if not isinstance(snapshot, str) or not _NAME_RE.match(snapshot):
        raise ValueError(f"snapshot: {snapshot!r} is not a snapshot name (letters, digits, "
                         "'.', '_', '-', ending in '.tar', as POST .../snapshots returns)")
    return snapshot


def create(folder: Path, meta: dict, ids: np.ndarray, words: np.ndarray) -> dict:
    """Write a snapshot of ``(ids, words)`` into ``folder/backups`` atomically; its listing
    entry (``snapshot`` name, ``bytes``, ``sha256`` of the tar, the manifest's fields)."""
    created = time.time()
    data, manifest = pack({**meta, "created_at": created}, ids, words)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(created))
    name = f"{meta.get('index', 'index')}-{stamp}-{uuid.uuid4().hex[:8]}.tar"
    directory = Path(folder) / DIR
    if not directory.exists():
        fsio.mkdir(directory, exist_ok=True)
        fsio.fsync_path(folder)
    path = directory / check_name(name)
    try:
        fsio.replace_file(path, data)
    except OSError:  # e.g. the directory's fsync after the rename: refused means absent
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return {"snapshot": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            **{k: manifest[k] for k in ("index", "bits", "mode", "items", "created_at")
               if k in manifest}}


def path_of(folder: Path, snapshot: str) -> Path:
    """The file of ``snapshot``; FileNotFoundError naming it when there is none."""
    path = Path(folder) / DIR / check_name(snapshot)
    if not path.is_file():
        raise FileNotFoundError(f"snapshot {snapshot!r} does not exist")
    return path


def listing(folder: Path) -> list[dict]:
    """Every snapshot of the index, oldest first: ``snapshot``, ``bytes``, ``created_at``."""
    directory = Path(folder) / DIR
    if not directory.is_dir():
        return []
    found = [(p.stat(), p.name) for p in directory.iterdir()
             if _NAME_RE.match(p.name) and p.is_file()]
    return [{"snapshot": name, "bytes": st.st_size, "created_at": st.st_mtime}
            for st, name in sorted(found, key=lambda f: (f[0].st_mtime, f[1]))]


def delete(folder: Path, snapshot: str) -> None:
    """Remove ``snapshot`` durably (FileNotFoundError when there is none)."""
    path = path_of(folder, snapshot)
    fsio.unlink(path, missing_ok=False)
    fsio.fsync_path(path.parent)
