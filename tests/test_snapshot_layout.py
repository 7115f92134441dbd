"""Issue 29: one snapshot writer (one atomic directory, one metadata file) that still reads the
snapshots an older bucketsearch wrote (layout 1: ``snapshot.json`` beside ``main/``)."""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from bucketsearch.index.storage import fsio, layout, snapshot
from bucketsearch.index.storage.fsio import FaultPlan
from bucketsearch.index.storage.live import LiveIndex
from bucketsearch.index.storage.store import save_arrays

BITS = 32
ROOT = Path(__file__).resolve().parents[1]


def _codes(ids):
    return (np.asarray(ids, dtype=np.uint64) * 2654435761 % (1 << BITS))[:, None]


def _answer(live, ids):
    found, words = live.get(ids)
    return found.tolist(), words[found].ravel().tolist()


def to_layout1(snap_dir, *, with_marks: bool):
    """Rewrite a snapshot as the writer before issue 29 did: ``snapshot.json`` (no
    ``id_high`` or ``merges`` in the oldest ones) and the engine's arrays in ``main/``."""
    main, info = snapshot.load(snap_dir, BITS)
    shutil.rmtree(snap_dir)
    snap_dir.mkdir()
    meta, arrays = main.snapshot()
    save_arrays(snap_dir / "main", main.kind,
                {"bits": main.bits, "ntotal": main.ntotal, **meta}, arrays)
    fields = {"wal_through": info.wal_through, "bits": BITS, "mode": info.mode,
              "substrings": info.substrings, "ntotal": int(main.ntotal)}
    if with_marks:
        fields.update(id_high=info.id_high, merges=info.merges)
    (snap_dir / "snapshot.json").write_text(json.dumps(fields))


def _folder(tmp_path, mode="single"):
    """Two snapshot generations and a log after them: ids 0..29 live, 3 deleted."""
    live = LiveIndex(tmp_path, BITS, mode, background_merge=False)
    live.add(_codes(range(20)), np.arange(20))
    live.merge()
    live.add(_codes(range(20, 30)), np.arange(20, 30))
    live.delete([3])
    live.merge()
    live.add(_codes([40]), [40])
    live.close()
    return tmp_path


def test_a_snapshot_is_one_directory_with_one_metadata_file(tmp_path):
    d = _folder(tmp_path)
    snaps = snapshot.list_snapshots(d)
    assert [t for t, _ in snaps] == [0, 1]
    for through, path in snaps:
        names = sorted(p.name for p in path.iterdir())
        assert layout.MANIFEST in names and layout.LEGACY_SNAPSHOT_META not in names
        assert all(p.is_file() for p in path.iterdir())  # no nested folder
        manifest = json.loads((path / layout.MANIFEST).read_text())
        assert manifest["meta"]["snapshot"]["layout"] == layout.SNAPSHOT_LAYOUT
        info = snapshot.read_info(path)
        assert (info.wal_through, info.bits, info.mode) == (through, BITS, "single")
    assert snapshot.read_info(snaps[-1][1]).merges == 2


def test_a_merge_writes_its_snapshot_with_one_temporary_directory_and_one_rename(tmp_path):
    live = LiveIndex(tmp_path, BITS, background_merge=False)
    live.add(_codes(range(5)), np.arange(5))
    calls = []
    with fsio.inject(lambda op, path: calls.append((op, str(path)))):
        live.merge()
    assert len([c for c in calls if c[0] == "mkdir"]) == 1
    renames = [p for op, p in calls if op == "rename" and "snap-" in p]
    assert renames == [str(tmp_path / layout.snapshot_name(0))]
    live.close()


@pytest.mark.parametrize("with_marks", [True, False])
@pytest.mark.parametrize("mmap", [False, True])
def test_layout1_snapshots_open_and_the_next_merge_writes_layout2(tmp_path, with_marks, mmap):
    d = _folder(tmp_path)
    want = _answer(LiveIndex(d, BITS, background_merge=False, read_only=True), range(45))
    for _, path in snapshot.list_snapshots(d):
        to_layout1(path, with_marks=with_marks)
    live = LiveIndex(d, BITS, background_merge=False, mmap=mmap)
    assert live.recovery.snapshot == 1 and not live.recovery.fallbacks
    assert _answer(live, range(45)) == want
    assert live.merges == (2 if with_marks else 0)
    assert live.state.next_id == 41
    live.add(_codes([50]), [50])
    live.merge()
    live.close()
    newest = snapshot.list_snapshots(d)[-1][1]
    assert not (newest / layout.LEGACY_SNAPSHOT_META).exists()
    assert snapshot.read_info(newest).wal_through == 2
    again = LiveIndex(d, BITS, background_merge=False)
    assert _answer(again, range(51)) == _answer(live, range(51))
    assert again.ntotal == 31


def test_a_corrupt_layout2_snapshot_falls_back_to_a_layout1_one(tmp_path):
    d = _folder(tmp_path)
    want = _answer(LiveIndex(d, BITS, background_merge=False, read_only=True), range(45))
    older, newest = (p for _, p in snapshot.list_snapshots(d))
    to_layout1(older, with_marks=True)
    (newest / layout.MANIFEST).write_text("{broken")
    live = LiveIndex(d, BITS, background_merge=False)
    assert live.recovery.snapshot == 0 and live.recovery.fallbacks
    assert _answer(live, range(45)) == want


def test_a_layout1_snapshot_with_a_damaged_array_falls_back(tmp_path):
    d = _folder(tmp_path)
    want = _answer(LiveIndex(d, BITS, background_merge=False, read_only=True), range(45))
    for _, path in snapshot.list_snapshots(d):
        to_layout1(path, with_marks=True)
    newest = snapshot.list_snapshots(d)[-1][1]
    array = max((newest / "main").glob("*.npy"), key=lambda p: p.stat().st_size)
    raw = bytearray(array.read_bytes())
    raw[-1] ^= 1
    array.write_bytes(bytes(raw))
    live = LiveIndex(d, BITS, background_merge=False)
    assert live.recovery.snapshot == 0 and not newest.exists()
    assert _answer(live, range(45)) == want


def test_an_unknown_snapshot_layout_is_refused_by_name(tmp_path):
    d = _folder(tmp_path)
    newest = snapshot.list_snapshots(d)[-1][1]
    manifest = json.loads((newest / layout.MANIFEST).read_text())
    manifest["meta"]["snapshot"]["layout"] = 3
    (newest / layout.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="snapshot layout 3, this bucketsearch reads 1 and 2"):
        snapshot.load(newest, BITS)
    live = LiveIndex(d, BITS, background_merge=False)  # falls back, like any damage
    assert live.recovery.snapshot == 0


def test_a_crash_inside_the_snapshot_write_leaves_no_snapshot_and_no_leftover(tmp_path):
    live = LiveIndex(tmp_path, BITS, background_merge=False)
    live.add(_codes(range(5)), np.arange(5))
    with pytest.raises(fsio.SimulatedCrash), fsio.inject(
            FaultPlan(at=1, ops=("rename",), path_contains="snap-", crash=True)):
        live.merge()
    assert snapshot.list_snapshots(tmp_path) == []
    assert layout.snapshot_leftovers(tmp_path)  # the temporary directory, until recovery
    again = LiveIndex(tmp_path, BITS, background_merge=False)
    assert again.ntotal == 5 and layout.snapshot_leftovers(tmp_path) == []


FOLDER_NAMES = re.compile(r"wal-|snap-|wal\.committed|index\.json|snapshot\.json|write\.pending|"
                          r"cost-history\.json|shard-|\.broken-|\.corrupt-|\.creating-|\.deleted-|"
                          r"^LOCK$|^backups$")


def spelled_names(source: str) -> list[str]:
    """String constants of ``source`` (not docstrings, not prose: no whitespace) that spell a
    file name of an index folder or of the data directory."""
    tree = ast.parse(source)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs and not re.search(r"\s", n.value)
            and FOLDER_NAMES.search(n.value)]


def test_only_the_layout_module_spells_the_folder_names():
    """Issue 29 item 3: one module owns every file name of an index folder."""
    assert spelled_names('"""wal-1"""\nx = f"snap-{t:08d}"\ny = "see wal-00000001.log"\n') \
        == ["snap-"]
    found = {p.relative_to(ROOT).as_posix(): names
             for p in sorted([*(ROOT / "index").rglob("*.py"), *(ROOT / "app").rglob("*.py")])
             if p.name != "layout.py" and (names := spelled_names(p.read_text()))}
    assert found == {}
