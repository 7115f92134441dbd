"""Crashes at every storage step, real SIGKILLs, and damaged files.

1. :class:`~bucketsearch.index.storage.fsio.SimulatedCrash` at the n-th storage call, for every n,
of an add, a
   re-insert, a delete, a merge (WAL rotation, snapshot arrays, manifests, snapshot metadata,
   renames, directory fsyncs, read-back verification, cleanup), a first merge, and of recovery
   itself (cutting a torn tail, falling back from a corrupt snapshot, after a merge that crashed
   half way); a write crashes either before its bytes or after half of them. The objects are
   then abandoned without closing and the index reopened from disk: every acknowledged write is
   there and nothing else (the interrupted write, never acknowledged, may be present or absent);
   afterwards it takes a write, a merge and a reopen.
2. Real crashes: a child process opens the index and SIGKILLs itself at chosen storage calls
   of an append, of a merge, and of the background merge an acknowledged add started;
   recovery runs in the test process.
3. Damage: a corrupt newest snapshot (an array flipped, the manifest or the snapshot metadata
   deleted) falls back to the previous generation plus the log and loses nothing; a damaged
   record in the middle of the newest or of an older segment makes opening fail with
   CorruptLogError naming the file and the offset, and changes no file.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from storage_model import (BITS, KW, POOL, XQ, Model, assert_matches, build_base,
                           corrupt_newest_snapshot, model_op, plant_torn_tail, resolve, snapshots)

from bucketsearch.index.storage import fsio, layout, snapshot, wal
from bucketsearch.index.storage.fsio import FaultPlan, SimulatedCrash
from bucketsearch.index.storage.live import CorruptIndexError, LiveIndex
from bucketsearch.index.storage.wal import CorruptLogError

pytestmark = pytest.mark.slow  # slow: make test-long

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fast_storage(monkeypatch):
    """fsync does nothing (a simulated crash keeps the page cache; the fault layer still sees
    every fsync call) and searches run on the calling thread."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setenv("BUCKETSEARCH_THREADS", "1")


def build_fresh(root: Path, mode: str) -> Model:
    """No snapshot yet: a log with adds, deletes and a re-insert (for the first merge)."""
    live = LiveIndex(root, BITS, mode, **KW)
    model = Model(BITS)
    for op in [("add", [0, 1, 2, 3], [0, 1, 2, 3]), ("delete", [1]), ("add", [1], [9]),
               ("delete", [2])]:
        if op[0] == "add":
            live.add(POOL[op[2]], op[1])
            model.apply(("add", op[1], POOL[op[2]]))
        else:
            live.delete(op[1])
            model.apply(("delete", op[1]))
    live.close()
    return model


def crash_mid_merge(directory: Path) -> None:
    """A merge that died after writing its snapshot arrays, before the rename."""
    mode = snapshot.read_info(snapshots(directory)[-1]).mode
    live = LiveIndex(directory, BITS, mode, **KW)
    with pytest.raises(SimulatedCrash), fsio.inject(FaultPlan(at=1, ops=("rename",),
                                                              path_contains="snap-",
                                                              crash=True)):
        live.merge()


@dataclass(frozen=True)
class Case:
    name: str
    base: str = "two-generations"  # or "fresh" (no snapshot yet)
    write: tuple | None = None
    merge: bool = False
    prepare: object = None  # the operation is the opening, after this
    set_mode: bool = False  # the operation is a mode change (single <-> mih, rebuilt in place)

    def model_op(self):
        return model_op(self.write)


CASES = [
    Case("add", write=("add", [100, 101], [21, 22])),
    Case("add-reinsert", write=("add", [5], [23])),
    Case("upsert", write=("upsert", [0, 3, 5, 100], [21, 22, 23, 24])),
    Case("set-mode", set_mode=True),
    Case("delete", write=("delete", [0, 13, 3])),
    Case("merge", merge=True),
    Case("first-merge", base="fresh", merge=True),
    Case("recover-torn-tail", prepare=plant_torn_tail),
    Case("recover-fallback", prepare=corrupt_newest_snapshot),
    Case("recover-after-crashed-merge", prepare=crash_mid_merge),
]


def perform(case: Case, live: LiveIndex) -> None:
    op = case.model_op()
    if op is not None and op[0] == "add":
        live.add(op[2], op[1])
    elif op is not None and op[0] == "upsert":
        live.upsert(op[2], op[1])
    elif op is not None:
        live.delete(op[1])
    if case.merge:
        live.merge()
    if case.set_mode:
        live.set_mode("mih" if live.mode == "single" else "single")


def phase(call: str, name: str) -> str:
    """Which step of a write a storage call belongs to (for the summary)."""
    if call == "unlink":
        return "cleanup"
    if name == "wal.committed":
        return "commit position"
    if name.startswith("wal-") and (name.endswith(".tmp") or call == "rename"):
        return "rotate"
    if name.startswith("wal-") and ".broken" in name:
        return "torn tail kept"
    if name.startswith("wal-"):
        return "log" if call != "read" else "log read"
    if call == "read":
        return "verify/load"
    if name.endswith(".npy"):
        return "snapshot arrays"
    if name in ("manifest.json", "snapshot.json"):
        return "manifest/metadata"
    if call == "rename":
        return "rename"
    if call == "mkdir":
        return "temp dirs"
    return "dir fsync"


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, op, path):
        self.calls.append((op, Path(path).name))


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    out = {}
    for mode in ("single", "mih"):
        root = tmp_path_factory.mktemp(f"two-generations-{mode}")
        out[("two-generations", mode)] = (root, build_base(root, mode))
        root = tmp_path_factory.mktemp(f"fresh-{mode}")
        out[("fresh", mode)] = (root, build_fresh(root, mode))
    return out


def fresh_copy(base: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base, dst)
    return dst


SUMMARY = {"points": Counter(), "phases": Counter(), "runs": 0, "present": 0, "absent": 0}


@pytest.mark.parametrize("mode", ["single", "mih"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_crash_at_every_storage_call(case, mode, bases, tmp_path):
    base, base_model = bases[(case.base, mode)]
    work = tmp_path / "index"
    d = fresh_copy(base, work)
    rec = Recorder()
    if case.prepare is not None:
        case.prepare(d)
        with fsio.inject(rec):
            LiveIndex(d, BITS, mode, **KW)
    else:
        live = LiveIndex(d, BITS, mode, **KW)
        with fsio.inject(rec):
            perform(case, live)
    assert rec.calls
    SUMMARY["points"][f"{mode} {case.name}"] += len(rec.calls)
    op = case.model_op()
    for n, (call, name) in enumerate(rec.calls, 1):
        SUMMARY["phases"][phase(call, name)] += 1
        for short in (False, True) if call == "write" else (False,):
            half = ", half written" if short else ""
            label = f"{mode} {case.name}: crash at call {n} ({call} {name}{half})"
            d = fresh_copy(base, work)
            if case.prepare is not None:
                case.prepare(d)
            else:
                live = LiveIndex(d, BITS, mode, **KW)
            with pytest.raises(SimulatedCrash), fsio.inject(
                    FaultPlan(at=n, crash=True, short=short)):
                if case.prepare is not None:
                    LiveIndex(d, BITS, mode, **KW)
                else:
                    perform(case, live)
            live = None  # abandoned: the process died
            again = LiveIndex(d, BITS, mode, **KW)
            try:
                model = resolve(again, base_model, [op] if op is not None else [], XQ)
                assert_matches(again, model, XQ)
            except AssertionError as exc:
                raise AssertionError(f"{label}: {exc}") from None
            SUMMARY["runs"] += 1
            if op is not None:
                SUMMARY["present" if model is not base_model else "absent"] += 1
            # it goes on working: a write, a merge, a reopen
            again.add(POOL[[26]], [300])
            model = model.applied(("add", np.array([300]), POOL[[26]]))
            again.merge()
            again.close()
            assert_matches(LiveIndex(d, BITS, mode, **KW), model, XQ, radii=(2,), ks=(3,))


# ------------------------------------------------------------------------------ real SIGKILL
CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import numpy as np
    from bucketsearch.index.storage import fsio
    from bucketsearch.index.storage.fsio import FaultPlan
    from bucketsearch.index.storage.live import LiveIndex
    d, mode, what, at, ops, contains, short = sys.argv[1:8]
    background = what == "add-background-merge"
    live = LiveIndex(d, {bits}, mode, background_merge=background,
                     merge_threshold=1 if background else 10**6)
    plan = FaultPlan(at=int(at), ops=tuple(ops.split(",")) if ops else (), kill=True,
                     path_contains=contains, short=short == "1")
    with fsio.inject(plan):
        if what.startswith("add"):
            live.add(np.array([[7]], dtype=np.uint64), [500])
            print("acknowledged", flush=True)
            live.wait_for_merge()  # the background merge it started
        else:
            live.merge()
    print("not killed")
""")

KILLS = [  # (what, n-th call, of these operations, whose path contains, half a write first)
    ("add", 1, "write", "wal-", "1"),  # half a WAL record on disk
    ("merge", 1, "rename", "wal-", ""),  # rotation: the new segment's rename
    ("merge", 2, "write", ".npy", "1"),  # in the middle of a snapshot array
    ("merge", 1, "rename", "snap-00000002", ""),  # the snapshot's one rename into place
    ("merge", 1, "read", "", ""),  # verification, after the rename
    ("merge", 1, "unlink", "", ""),  # cleanup of the oldest generation
    # an acknowledged add, then its background merge dies at the snapshot's final rename
    ("add-background-merge", 1, "rename", "snap-00000002", ""),
]


@pytest.mark.slow
@pytest.mark.parametrize("kill", KILLS, ids=lambda k: f"{k[0]}-{k[2]}-{k[3] or 'any'}")
def test_sigkill_during_write_then_recover(kill, bases, tmp_path):
    what, at, ops, contains, short = kill
    base, model = bases[("two-generations", "single")]
    d = fresh_copy(base, tmp_path / "index")
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT), bits=BITS))
    proc = subprocess.run([sys.executable, str(script), str(d), "single", what, str(at), ops,
                           contains, short], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BUCKETSEARCH_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert ("acknowledged" in proc.stdout) == (what == "add-background-merge")
    live = LiveIndex(d, BITS, "single", **KW)
    op = ("add", np.array([500]), np.array([[7]], dtype=np.uint64))
    if "acknowledged" in proc.stdout:
        model = model.applied(op)
    elif what == "add":
        model = resolve(live, model, [op], XQ)  # killed inside the add: either way
    assert_matches(live, model, XQ)
    if what == "add":
        assert live.recovery.torn_bytes > 0 and live.recovery.broken_files
    live.add(POOL[[26]], [300])
    live.merge()
    live.close()
    assert_matches(LiveIndex(d, BITS, "single", **KW),
                   model.applied(("add", np.array([300]), POOL[[26]])), XQ)


# ------------------------------------------------------------------------------------- damage
def _digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["array", "manifest", "snapshot-meta"])
def test_corrupt_newest_snapshot_falls_back_to_the_previous_generation(damage, bases,
                                                                       tmp_path):
    base, model = bases[("two-generations", "single")]
    d = fresh_copy(base, tmp_path / "index")
    older, newest = snapshots(d)
    if damage == "array":
        corrupt_newest_snapshot(d)
    elif damage == "manifest":  # listed, unreadable
        layout.snapshot_metadata(newest).write_text("{broken")
    else:  # its metadata gone: not a snapshot at all
        layout.snapshot_metadata(newest).unlink()
    live = LiveIndex(d, BITS, "single", **KW)
    assert live.recovery.snapshot == int(older.name[5:])
    assert_matches(live, model, XQ)
    if damage != "snapshot-meta":  # one that is not even listed is not quarantined either
        assert live.recovery.fallbacks and not newest.exists()
    # the index goes on: writes, two merges (the fallback generation is kept until then)
    live.add(POOL[[26]], [300])
    model = model.applied(("add", np.array([300]), POOL[[26]]))
    live.merge()
    live.delete([0])
    model = model.applied(("delete", np.array([0])))
    live.merge()
    live.close()
    assert_matches(LiveIndex(d, BITS, "single", **KW), model, XQ)
    corrupt_newest_snapshot(d)  # and the new generations fall back as well
    assert_matches(LiveIndex(d, BITS, "single", **KW), model, XQ)


def test_both_snapshots_corrupt_is_refused(bases, tmp_path):
    base, _ = bases[("two-generations", "single")]
    d = fresh_copy(base, tmp_path / "index")
    for snap in snapshots(d):
        layout.snapshot_metadata(snap).write_text("{broken")
    logs = {p.name: p.read_bytes() for _, p in wal.list_segments(d)}
    with pytest.raises(CorruptIndexError, match="no usable snapshot"):
        LiveIndex(d, BITS, "single", **KW)
    assert {p.name: p.read_bytes() for _, p in wal.list_segments(d)} == logs


def _records(path: Path) -> list[int]:
    """Start offsets of the records of a segment."""
    data, pos, out = path.read_bytes(), len(wal.MAGIC), []
    while pos < len(data):
        out.append(pos)
        pos += wal.HEADER.size + wal.HEADER.unpack_from(data, pos)[0]
    return out


def _two_segments_after_the_snapshot(tmp_path: Path) -> tuple[Path, list[Path]]:
    """An index whose recovery replays two segments: a merge failed after rotating."""
    d = tmp_path / "index"
    live = LiveIndex(d, BITS, "single", **KW)
    for i in range(4):
        live.add(POOL[[i]], [i])
    live.merge()
    for i in range(4, 8):
        live.add(POOL[[i]], [i])
    with pytest.raises(OSError), fsio.inject(FaultPlan(at=1, ops=("mkdir",))):
        live.merge()  # rotated, then failed: segments 1 and 2 both follow snapshot 0
    for i in range(8, 12):
        live.add(POOL[[i]], [i])
    live.close()
    segs = [p for _, p in wal.list_segments(d)]  # 0 stays: the fallback to an empty base
    assert [p.name for p in segs] == ["wal-00000000.log", "wal-00000001.log", "wal-00000002.log"]
    return d, segs[1:]


@pytest.mark.parametrize("where", ["newest", "older", "older-torn"])
def test_damaged_record_in_the_middle_is_refused(where, tmp_path):
    d, segs = _two_segments_after_the_snapshot(tmp_path)
    seg = segs[-1] if where == "newest" else segs[0]
    starts = _records(seg)
    data = bytearray(seg.read_bytes())
    if where == "older-torn":  # a torn tail is only repaired in the newest segment
        offset = starts[-1]
        data = data[:-3]
    else:
        offset = starts[1]  # the second of four records: valid ones follow
        data[offset + wal.HEADER.size + 3] ^= 0xFF
    seg.write_bytes(bytes(data))
    before = _digest(d)
    with pytest.raises(CorruptLogError) as info:
        LiveIndex(d, BITS, "single", **KW)
    assert info.value.path.name == seg.name and info.value.offset == offset
    assert f"{seg.name}: corrupt at byte {offset}" in str(info.value)
    assert _digest(d) == before  # nothing cut, renamed or rewritten


def test_undamaged_index_with_two_segments_recovers(tmp_path):
    d, _ = _two_segments_after_the_snapshot(tmp_path)
    model = Model(BITS, {i: tuple(int(x) for x in POOL[i]) for i in range(12)})
    assert_matches(LiveIndex(d, BITS, "single", **KW), model, XQ)


def test_zz_crash_summary(capsys):
    if not SUMMARY["runs"]:
        pytest.skip("the crash matrix did not run")
    with capsys.disabled():
        print("\ncrash points: " + ", ".join(f"{k} {v}" for k, v in SUMMARY["points"].items()))
        print("by step: " + ", ".join(f"{k} {v}" for k, v in sorted(SUMMARY["phases"].items())))
        print(f"simulated crashes: {SUMMARY['runs']} (every storage call; writes also half "
              f"written), recovered equal to the model: {SUMMARY['runs']}; interrupted writes "
              f"present after recovery: {SUMMARY['present']}, absent: {SUMMARY['absent']}")
