"""Upsert, get, change of mode, backup and restore: the live index first, then the HTTP API.

Answers are checked against the brute-force model of ``storage_model``; a mode change and a
restore are also checked across a reopen (the snapshot carries the mode)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import app_client
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_model import Model, assert_matches, clustered_pool

from bucketsearch.index.codes import to_hex
from bucketsearch.index.storage import backup, exports, fsio
from bucketsearch.index.storage.fsio import FaultPlan
from bucketsearch.index.storage.live import LiveIndex

BITS = 20
POOL = clustered_pool(BITS, 60, seed=3)
XQ = POOL[50:]
KW = dict(background_merge=False, merge_threshold=10**6)


def loaded(tmp_path, mode="single") -> tuple[LiveIndex, Model]:
    """Ids 0..9 merged into the main snapshot, 10..14 in the delta, 3 re-inserted."""
    live, model = LiveIndex(tmp_path, BITS, mode, **KW), Model(BITS)
    for ids, rows in ((range(10), range(10)), (range(10, 15), range(10, 15))):
        ids, rows = np.array(ids), np.array(rows)
        live.add(POOL[rows], ids)
        model.apply(("add", ids, POOL[rows]))
        if ids[0] == 0:
            live.merge()
    live.delete([3])
    live.add(POOL[[40]], [3])
    model.apply(("upsert", np.array([3]), POOL[[40]]))
    return live, model


# ------------------------------------------------------------------------------ upsert, get
def test_upsert_inserts_and_replaces_in_main_delta_and_after_reopen(tmp_path):
    live, model = loaded(tmp_path)
    ids = np.array([0, 3, 12, 100])  # in main; re-inserted; in the delta; new
    assert live.upsert(POOL[[41, 42, 43, 44]], ids) == (1, 3)
    model.apply(("upsert", ids, POOL[[41, 42, 43, 44]]))
    assert_matches(live, model, XQ)
    assert live.upsert(POOL[[41, 42, 43, 44]], ids) == (0, 4)  # idempotent
    assert_matches(live, model, XQ)
    live.close()
    live = LiveIndex(tmp_path, BITS, "single", **KW)  # replayed from the WAL's upsert record
    assert_matches(live, model, XQ)
    live.merge()
    assert_matches(live, model, XQ)
    live.close()


def test_upsert_rejects_a_batch_with_an_id_twice(tmp_path):
    live, _ = loaded(tmp_path)
    with pytest.raises(ValueError, match="id 7 appears more than once"):
        live.upsert(POOL[[1, 2]], [7, 7])
    with pytest.raises(ValueError, match="ids has 1 entries but codes has 2"):
        live.upsert(POOL[[1, 2]], [7])
    live.close()


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, 30), unique=True, max_size=12))
def test_get_returns_the_newest_code_of_live_ids(tmp_path_factory, ids):
    live, model = loaded(tmp_path_factory.mktemp("get"))
    live.delete([5, 11])
    model.apply(("delete", np.array([5, 11])))
    found, words = live.get(ids)
    for i, f, w in zip(ids, found, words):
        assert f == (i in model.items)
        assert tuple(int(x) for x in w) == (model.items[i] if f else (0,))
    live.close()


# ------------------------------------------------------------------------------ set_mode
@pytest.mark.parametrize("start,to", [("single", "mih"), ("mih", "auto"), ("auto", "single")])
def test_set_mode_rebuilds_in_place_and_the_reopen_keeps_it(tmp_path, start, to):
    live, model = loaded(tmp_path, start)
    assert live.set_mode(to)
    assert live.mode == to and type(live.state.main).__name__ != "" and not live.set_mode(to)
    assert_matches(live, model, XQ)
    live.add(POOL[[45]], [200])
    model.apply(("add", np.array([200]), POOL[[45]]))
    live.close()
    live = LiveIndex(tmp_path, BITS, start, **KW)  # the creation mode; the snapshot wins
    assert live.mode == to
    assert_matches(live, model, XQ)
    live.close()


def test_set_mode_of_an_empty_index_is_kept(tmp_path):
    live = LiveIndex(tmp_path, BITS, "single", **KW)
    assert live.set_mode("mih")
    live.close()
    assert LiveIndex(tmp_path, BITS, "single", **KW).mode == "mih"


def test_set_mode_rejects_a_mode_that_is_not_served(tmp_path):
    live = LiveIndex(tmp_path, BITS, "single", **KW)
    with pytest.raises(ValueError, match="mode"):
        live.set_mode("scan")
    live.close()


# ------------------------------------------------------------------------------ backup file
def deep_header() -> bytes:
    """A backup whose JSON header nests 100,000 deep (a stack overflow for a recursive parser)
    with a valid CRC: refused as an invalid header, not a crash."""
    import struct
    import zlib
    header = b"[" * 100_000 + b"]" * 100_000
    body = backup.MAGIC + struct.pack("<II", 1, len(header)) + header
    return body + struct.pack("<I", zlib.crc32(body))


def test_backup_roundtrip_and_every_damage_is_named(tmp_path):
    live, model = loaded(tmp_path)
    ids, words = live.state.items()
    data = backup.dump({"bits": BITS, "mode": "single"}, ids, words)
    meta, ids2, words2 = backup.load(data)
    assert meta["bits"] == BITS and meta["n"] == len(model)
    assert {int(i): tuple(int(x) for x in w) for i, w in zip(ids2, words2)} == model.items
    assert list(ids2) == sorted(ids2)
    bad = bytearray(data)
    bad[len(data) // 2] ^= 1
    for damaged, message in [(b"hello", "not a bucketsearch backup"),
                             (data[:-9] + data[-4:], "checksum"),
                             (bytes(bad), "checksum"),
                             (data[:8] + b"\x02" + data[9:], "version 2"),
                             (deep_header(), "header is not valid")]:
        with pytest.raises(backup.BackupError, match=message):
            backup.load(damaged)
    live.close()


# ------------------------------------------------------------------------------ HTTP
def hexes(rows) -> list[str]:
    return to_hex(POOL[rows], BITS)


def search_ids(client, name, rows, k=None, r=None) -> list:
    body = {"codes": hexes(rows), **({"k": k} if k else {}),
            **({"max_distance": r} if r is not None else {})}
    res = client.post(f"/v1/indexes/{name}/search", json=body)
    assert res.status_code == 200, res.text
    return [list(zip(q["distances"], q["ids"])) for q in res.json()["results"]]


@pytest.fixture
def client(tmp_path):
    """The app in process (FastAPI's TestClient) on a fresh data directory."""
    with app_client(tmp_path / "d") as c:
        yield c


def test_http_upsert_get_mode_backup_restore(client):
    c = client
    assert c.post("/v1/indexes", json={"name": "a", "bits": BITS, "mode": "single"}
                  ).status_code == 201
    assert c.post("/v1/indexes/a/items", json={"ids": list(range(10)),
                                               "codes": hexes(range(10))}).status_code == 200
    res = c.post("/v1/indexes/a/items/upsert", json={"ids": [2, 50], "codes": hexes([40, 41])})
    assert res.json() == {"inserted": 1, "replaced": 1, "deleted": None, "first_id": None,
                          "size": 11}
    res = c.post("/v1/indexes/a/items/add", json={"ids": [2], "codes": hexes([1])})
    assert res.status_code in (404, 405)
    got = c.post("/v1/indexes/a/items/get", json={"ids": [2, 50, 9, 77]}).json()
    assert got == {"ids": [2, 50, 9, 77], "codes": hexes([40, 41, 9]) + [None]}
    before = search_ids(c, "a", [40, 3], r=3)

    res = c.patch("/v1/indexes/a", json={"mode": "mih"})
    assert res.status_code == 200 and res.json()["mode"] == "mih"
    assert search_ids(c, "a", [40, 3], r=3) == before
    res = c.patch("/v1/indexes/a", json={"mode": "scan"})
    assert res.status_code == 400 and "mode" in res.text

    data = c.get("/v1/indexes/a/backup")
    assert data.headers["content-type"] == "application/octet-stream"
    res = c.post("/v1/indexes/b/restore", content=data.content,
                 headers={"Content-Type": "application/octet-stream"})
    assert res.status_code == 201, res.text
    assert res.json()["mode"] == "mih" and res.json()["size"] == 11
    assert search_ids(c, "b", [40, 3], r=3) == before
    assert c.post("/v1/indexes/b/restore", content=data.content,
                  headers={"Content-Type": "application/octet-stream"}).status_code == 409
    res = c.post("/v1/indexes/c/restore", content=data.content[:-1],
                 headers={"Content-Type": "application/octet-stream"})
    assert res.status_code == 400 and "checksum" in res.json()["detail"]
    res = c.post("/v1/indexes/c/restore", json={"x": 1})
    assert res.status_code == 415 and "backup" in res.json()["detail"]
    assert c.get("/v1/indexes/c").status_code == 404  # nothing left behind


def test_a_restore_that_fails_halfway_leaves_no_index(client, tmp_path):
    c = client
    c.post("/v1/indexes", json={"name": "a", "bits": BITS, "mode": "single"})
    c.post("/v1/indexes/a/items", json={"ids": list(range(20)), "codes": hexes(range(20))})
    data = c.get("/v1/indexes/a/backup").content
    failed = []
    for at in range(1, 40, 3):  # ENOSPC at the at-th storage call of the restore
        with fsio.inject(FaultPlan(at=at, errno=28)):
            res = c.post("/v1/indexes/b/restore", content=data,
                         headers={"Content-Type": "application/octet-stream"})
        assert res.status_code in (201, 503, 507), res.text
        if res.status_code == 201:
            break
        failed.append(at)
        assert c.get("/v1/indexes/b").status_code == 404
        assert not [p for p in (tmp_path / "d" / "indexes").iterdir() if p.name.startswith("b")]
    res = c.post("/v1/indexes/b/restore", content=data,
                 headers={"Content-Type": "application/octet-stream"})
    assert res.status_code in (201, 409)
    assert c.get("/v1/indexes/b").json()["size"] == 20
    assert len(failed) >= 5, failed  # the fault hit the restore's own writes, several times


@pytest.mark.parametrize("form", ["file", "snapshot"])
def test_a_backup_during_concurrent_writes_holds_every_write_acknowledged_before_it(client, form):
    """Issue 13's acceptance: writes acknowledged before the backup began are all in the
    restored index; nothing else is (each write is whole or absent), codes included. ``form``:
    the backup file (GET .../backup) or a snapshot tar (POST .../snapshots)."""
    import threading

    c = client
    c.post("/v1/indexes", json={"name": "w", "bits": BITS, "mode": "single"})
    registry = c.app.state.registry
    live = registry.get("w").live
    acked: list[int] = []
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 3000:
            live.add(POOL[[i % 50]], [i])
            acked.append(i)  # after add returned: acknowledged
            if i % 7 == 0:
                live.upsert(POOL[[(i + 1) % 50]], [i])
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    while len(acked) < 200:
        pass
    rounds = []
    for _ in range(3):  # backups while the writer runs (merges happen meanwhile too)
        before = set(acked)
        entry = registry.get("w")
        if form == "file":
            data = registry.backup(entry)
        else:
            data = registry.snapshot_path(entry, registry.snapshot(entry)["snapshot"]).read_bytes()
        rounds.append((before, data))
    stop.set()
    thread.join()
    for n, (before, data) in enumerate(rounds):
        entry = registry.restore(f"r{n}", data)
        ids, words = entry.live.state.items()
        got = dict(zip(ids.tolist(), map(tuple, words.tolist())))
        assert before <= set(got) <= set(acked)
        for i, code in got.items():  # the add's code, or the upsert's that replaced it
            upserted = (tuple(POOL[(i + 1) % 50]),) if i % 7 == 0 else ()
            assert code in (tuple(POOL[i % 50]), *upserted)


# ------------------------------------------------------------------------------ snapshots
def tar_of(res) -> dict:
    """The members of a snapshot tar download, by name."""
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(res.content)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def restore(c, name, data, ctype="application/x-tar"):
    return c.post(f"/v1/indexes/{name}/restore", content=data, headers={"Content-Type": ctype})


def test_http_snapshots_create_list_download_restore_delete(client, tmp_path):
    import hashlib
    import json

    c = client
    c.post("/v1/indexes", json={"name": "a", "bits": BITS, "mode": "mih"})
    c.post("/v1/indexes/a/items", json={"ids": list(range(30)), "codes": hexes(range(30))})
    c.post("/v1/indexes/a/items/delete", json={"ids": [4]})
    before = search_ids(c, "a", [40, 3], r=3)
    assert c.get("/v1/indexes/a/snapshots").json() == []

    res = c.post("/v1/indexes/a/snapshots")
    assert res.status_code == 201, res.text
    info = res.json()
    assert info["index"] == "a" and info["items"] == 29 and info["bits"] == BITS
    assert info["mode"] == "mih" and info["snapshot"].startswith("a-")
    listed = c.get("/v1/indexes/a/snapshots").json()
    assert [s["snapshot"] for s in listed] == [info["snapshot"]]
    assert listed[0]["bytes"] == info["bytes"]

    res = c.get(f"/v1/indexes/a/snapshots/{info['snapshot']}")
    assert res.status_code == 200 and res.headers["content-type"] == "application/x-tar"
    assert hashlib.sha256(res.content).hexdigest() == info["sha256"]
    members = tar_of(res)
    assert sorted(members) == ["index.bsbackup", "manifest.json"]
    manifest = json.loads(members["manifest.json"])
    assert manifest["files"]["index.bsbackup"]["sha256"] == \
        hashlib.sha256(members["index.bsbackup"]).hexdigest()
    assert manifest["items"] == 29 and manifest["bits"] == BITS
    data = res.content

    c.post("/v1/indexes/a/items", json={"ids": [100], "codes": hexes([41])})  # after it
    res = restore(c, "b", data)
    assert res.status_code == 201, res.text
    assert res.json()["mode"] == "mih" and res.json()["size"] == 29
    assert search_ids(c, "b", [40, 3], r=3) == before
    # the backup file form still restores, and a tar sent as octet-stream is recognised
    assert restore(c, "b2", data, "application/octet-stream").status_code == 201
    assert restore(c, "b2", data).status_code == 409

    # damage: every kind refused with the reason, nothing left behind
    payload_at = data.index(members["index.bsbackup"][:64])
    flipped = bytearray(data)
    flipped[payload_at + 40] ^= 1
    import io
    import tarfile

    def tar_with(files: dict) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for name, blob in files.items():
                item = tarfile.TarInfo(name)
                item.size = len(blob)
                tar.addfile(item, io.BytesIO(blob))
        return out.getvalue()
    for damaged, reason in ((bytes(flipped), "SHA-256"),
                            (data[:payload_at + 100], "SHA-256|not a readable snapshot tar"),
                            (tar_with({"index.bsbackup": members["index.bsbackup"]}),
                             "lacks manifest.json"),
                            (tar_with({"manifest.json": b"[" * 10**5 + b"]" * 10**5,
                                       "index.bsbackup": members["index.bsbackup"]}),
                             "not valid JSON"),
                            (data[:1024].replace(b"bucketsearch-snapshot", b"bucketsearch-snapshoT"),
                             "not a readable|not valid JSON|format")):
        res = restore(c, "c", damaged)
        assert res.status_code == 400, (reason, res.text)
        assert re.search(reason, res.json()["detail"]), res.json()["detail"]
        assert c.get("/v1/indexes/c").status_code == 404
    res = restore(c, "c", b"not a tar", "text/plain")
    assert res.status_code == 415 and "application/x-tar" in res.json()["detail"]

    # names: a bad one is 400 naming the field, a missing one 404 naming it
    res = c.get("/v1/indexes/a/snapshots/..secret.tar")
    assert res.status_code == 400 and "snapshot" in res.json()["detail"]
    res = c.get("/v1/indexes/a/snapshots/a-none.tar")
    assert res.status_code == 404 and "a-none.tar" in res.json()["detail"]
    assert c.get("/v1/indexes/nope/snapshots").status_code == 404

    registry = c.app.state.registry
    with registry.open_snapshot(registry.get("a"), info["snapshot"]) as opened:
        exports.delete(registry.get("a").folder, info["snapshot"])  # deleted mid-download
        assert opened.read() == data
    info = c.post("/v1/indexes/a/snapshots").json()
    assert c.delete(f"/v1/indexes/a/snapshots/{info['snapshot']}").status_code == 204
    assert c.get(f"/v1/indexes/a/snapshots/{info['snapshot']}").status_code == 404
    assert c.delete(f"/v1/indexes/a/snapshots/{info['snapshot']}").status_code == 404
    assert c.get("/v1/indexes/a/snapshots").json() == []


def test_a_snapshot_that_fails_or_crashes_halfway_is_whole_or_absent(client, tmp_path):
    """ENOSPC at each storage call of POST .../snapshots: 503, and no snapshot is listed; a
    simulated crash at each call: what is listed afterwards restores whole (a snapshot is
    renamed into place complete, a temp file is never listed)."""
    c = client
    c.post("/v1/indexes", json={"name": "a", "bits": BITS, "mode": "single"})
    c.post("/v1/indexes/a/items", json={"ids": list(range(25)), "codes": hexes(range(25))})
    failed = 0
    for at in range(1, 12):
        with fsio.inject(FaultPlan(at=at, errno=28)) as plan:
            res = c.post("/v1/indexes/a/snapshots")
        if not plan.fired:
            assert res.status_code == 201
            break
        failed += 1
        assert res.status_code == 503 and "storage" in res.json()["detail"], res.text
        assert c.get("/v1/indexes/a/snapshots").json() == []
    assert failed >= 4  # mkdir, the directory's fsync, the temp file's open/write/fsync, ...
    registry = c.app.state.registry
    for at in range(1, 12):
        plan = FaultPlan(at=at, crash=True)
        try:
            with fsio.inject(plan):
                registry.snapshot(registry.get("a"))
        except fsio.SimulatedCrash:
            pass
        for snap in c.get("/v1/indexes/a/snapshots").json():
            data = c.get(f"/v1/indexes/a/snapshots/{snap['snapshot']}").content
            name = f"r{at}-{snap['snapshot'][-12:-4]}"
            assert restore(c, name, data).status_code in (201, 409)
            assert c.get(f"/v1/indexes/{name}").json()["size"] == 25
        if not plan.fired:
            break


# ----------------------------------------------- fields checked after the checksums (issue 31)
def reframed(data: bytes, **changes) -> bytes:
    """``data`` (a backup file) with header fields changed (None: removed) and every checksum
    valid again: only the fields are wrong."""
    import json
    import struct
    import zlib
    fixed = len(backup.MAGIC) + 8
    _, hlen = struct.unpack_from("<II", data, len(backup.MAGIC))
    header = json.loads(data[fixed:fixed + hlen])
    for key, value in changes.items():
        if value is None:
            header.pop(key, None)
        else:
            header[key] = value
    raw = json.dumps(header).encode()
    body = backup.MAGIC + struct.pack("<II", 1, len(raw)) + raw + data[fixed + hlen:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def retarred(tar: bytes, payload: bytes | None = None, **changes) -> bytes:
    """A snapshot tar with manifest fields changed and ``payload`` in place of the backup,
    its SHA-256 and size in the manifest kept valid unless ``changes`` says otherwise."""
    import hashlib
    import io
    import json
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        manifest = json.loads(t.extractfile("manifest.json").read())
        old = t.extractfile("index.bsbackup").read()
    payload = old if payload is None else payload
    manifest["files"]["index.bsbackup"] = {"bytes": len(payload),
                                           "sha256": hashlib.sha256(payload).hexdigest()}
    for key, value in changes.items():
        target, _, leaf = key.rpartition(".")
        node = manifest
        for part in filter(None, target.split(".")):
            node = node[part if part != "payload" else "index.bsbackup"]
        node[leaf] = value
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in (("manifest.json", json.dumps(manifest).encode()),
                           ("index.bsbackup", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


BAD_HEADERS = [({"substrings": "x"}, "'substrings'"), ({"substrings": 2.5}, "'substrings'"),
               ({"substrings": True}, "'substrings'"), ({"substrings": 99}, "substrings"),
               ({"bits": True}, "'bits'"), ({"bits": 20.0}, "'bits'"), ({"bits": "20"}, "'bits'"),
               ({"bits": 2000}, "'bits'"), ({"n": 1.5}, "'n'"), ({"n": -1}, "'n'"),
               ({"words": None}, "'words'"), ({"mode": 5}, "'mode'"), ({"mode": "scan"}, "'mode'"),
               ({"mode": None}, "'mode'")]


@pytest.mark.parametrize("changes,field", BAD_HEADERS, ids=[str(c) for c, _ in BAD_HEADERS])
def test_a_restore_with_valid_checksums_but_invalid_fields_is_a_clear_400(client, changes,
                                                                          field):
    """Before: a non-integer ``substrings`` (checksums valid) answered 500."""
    c = client
    assert c.post("/v1/indexes", json={"name": "a", "bits": BITS, "mode": "mih"}).status_code \
        == 201
    c.post("/v1/indexes/a/items", json={"ids": [1, 2], "codes": hexes([1, 2])})
    data = reframed(c.get("/v1/indexes/a/backup").content, **changes)
    res = c.post("/v1/indexes/b/restore", content=data,
                 headers={"Content-Type": "application/octet-stream"})
    assert res.status_code == 400, res.text
    assert field in res.json()["detail"], res.json()["detail"]
    assert c.get("/v1/indexes/b").status_code == 404


MANIFEST_CHANGES = [({"payload.bytes": "12"}, "bytes"), ({"payload.bytes": True}, "bytes"),
                    ({"payload.sha256": 5}, "sha256"), ({"version": 1.0}, "version"),
                    ({"items": "2"}, "items"), ({"items": 7}, "items=7"),
                    ({"bits": 8}, "bits=8"), ({"mode": "single"}, "mode='single'")]


@pytest.mark.parametrize("changes,field", MANIFEST_CHANGES,
                         ids=[str(c) for c, _ in MANIFEST_CHANGES])
def test_a_snapshot_whose_manifest_fields_are_invalid_is_a_clear_400(client, changes, field):
    c = client
    c.post("/v1/indexes", json={"name": "a", "bits": BITS, "mode": "mih"})
    c.post("/v1/indexes/a/items", json={"ids": [1, 2], "codes": hexes([1, 2])})
    name = c.post("/v1/indexes/a/snapshots").json()["snapshot"]
    tar = c.get(f"/v1/indexes/a/snapshots/{name}").content
    assert restore(c, "ok", retarred(tar)).status_code == 201  # the rebuilt tar is fine as is
    changes = {k.replace("payload.", "files.payload."): v for k, v in changes.items()}
    res = restore(c, "b", retarred(tar, **changes))
    assert res.status_code == 400, res.text
    assert field in res.json()["detail"], res.json()["detail"]
    # a payload whose own header is invalid, inside a tar with a valid manifest
    res = restore(c, "b", retarred(tar, reframed(tar_payload(tar), substrings="x")))
    assert res.status_code == 400 and "'substrings'" in res.json()["detail"]


def tar_payload(tar: bytes) -> bytes:
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return t.extractfile("index.bsbackup").read()
