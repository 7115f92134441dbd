"""Storage faults at every call of every write operation of the live index (SQLite's I/O-error
test loop): the n-th storage call of the operation fails, for every n until the operation makes
no more calls, with every kind of fault that call can see.

Operations: add, add of a deleted id (re-insert), delete, merge (WAL rotation, snapshot arrays,
manifests, renames, directory fsyncs, read-back verification, cleanup), an add that starts a
background merge (both under the fault), opening the index (recovery cutting a torn tail;
recovery falling back from a corrupt newest snapshot), and writing an engine snapshot over an
existing one (:func:`bucketsearch.index.storage.store.save_arrays`). Kinds: once, ENOSPC and EIO on
any call, a
short write (half the bytes, then ENOSPC) on a write, EMFILE on an open; sticky (that call and
every later one fail until the operation returns), EIO and the short write. Mode "single" gets
every kind, "mih" (same storage path, other snapshot files) the once-kinds; the add that starts a
background merge gets EIO only (its merge's calls get every kind in "merge").

For each combination: (a) the operation either returned (acknowledged: the model is updated) or
raised and the model is unchanged; (b) the index still answers exactly as the model; (c) with
the fault gone, the failed write retried succeeds, a new write and a merge succeed; (d) reopened
from disk it equals the model: every acknowledged write present, the failed one absent, never
beside its retry; (e) every snapshot left verifies, and with the newest one damaged the index
still reopens equal to the model (the previous generation is usable). When the log was left
unrestorable (LogFailed) the directory is also copied as a crash would leave it and reopened:
there the failed write may come back (its record may be complete on disk: the outcome of a
write whose fsync failed is unknown) but nothing else; and, in a second run of the same
combination, the index is closed (the disk works again: close() retries the undo) and
reopened before the retry: there the failed write is absent.

``test_zz_summary`` prints the figures (through ``capsys.disabled``, so also without ``-s``).
"""
from __future__ import annotations

import errno
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from storage_model import (BITS, KW, POOL, XQ, Model, assert_matches, build_base,
                           corrupt_newest_snapshot, differences, model_op, plant_torn_tail, queries,
                           resolve, snapshots)

from bucketsearch.index.storage import fsio, snapshot
from bucketsearch.index.storage.fsio import FaultPlan
from bucketsearch.index.storage.live import LiveIndex
from bucketsearch.index.storage.store import load_arrays, save_arrays
from bucketsearch.index.storage.wal import LogFailed

pytestmark = pytest.mark.slow  # slow: make test-long


@dataclass(frozen=True)
class Case:
    name: str
    write: tuple | None = None  # ("add" or "upsert", ids, rows) or ("delete", ids)
    merge: bool = False
    background: bool = False
    prepare: object = None  # damage planted before opening: the operation is the opening
    quarantined: int = 0  # at most this many set aside as corrupt (the planted damage)
    set_mode: bool = False  # the operation is a mode change (single <-> mih, rebuilt in place)

    @property
    def opens(self) -> bool:
        return self.prepare is not None

    def model_op(self):
        return model_op(self.write)

    def options(self) -> dict:
        return dict(KW, background_merge=True, merge_threshold=4) if self.background else KW


CASES = [
    Case("add", write=("add", [100, 101], [21, 22])),
    Case("add-reinsert", write=("add", [5], [23])),
    Case("upsert", write=("upsert", [0, 3, 5, 100], [21, 22, 23, 24])),
    Case("set-mode", set_mode=True),
    Case("delete", write=("delete", [0, 13, 3])),
    Case("merge", merge=True),
    Case("add+background-merge", write=("add", [102], [24]), background=True),
    Case("recover-torn-tail", prepare=plant_torn_tail),
    Case("recover-fallback", prepare=corrupt_newest_snapshot, quarantined=1),
]


def perform(case: Case, live: LiveIndex) -> None:
    op = case.model_op()
    if op is not None and op[0] == "add":
        assert live.add(op[2], op[1]) == len(op[1])
    elif op is not None and op[0] == "upsert":
        assert sum(live.upsert(op[2], op[1])) == len(op[1])
    elif op is not None:
        assert live.delete(np.append(op[1], 999)) == len(op[1])  # 999: absent, ignored
    if case.merge:
        assert live.merge()
    if case.background:
        live.wait_for_merge()
    if case.set_mode:
        assert live.set_mode("mih" if live.mode == "single" else "single")


def kinds_for(call: str, sticky: bool = False) -> list[tuple[str, dict]]:
    """The faults a call can see: ENOSPC, EIO, a short write (writes), EMFILE (opens); sticky
    (the disk stays broken until the operation returns): EIO and the short write."""
    kinds = [("EIO", dict(errno=errno.EIO))]
    if not sticky:
        kinds.append(("ENOSPC", dict(errno=errno.ENOSPC)))
    if call == "write":
        kinds.append(("short", dict(errno=errno.ENOSPC, short=True)))
    if call == "open" and not sticky:
        kinds.append(("EMFILE", dict(errno=errno.EMFILE)))
    return [(kind, dict(spec, sticky=sticky)) for kind, spec in kinds]


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, op, path):
        self.calls.append((op, Path(path).name))


class Outcome:
    def __init__(self):
        self.runs = Counter()  # case -> combinations
        self.points = Counter()  # case -> storage calls
        self.raised = Counter()
        self.absorbed = Counter()  # the fault hit but the operation still succeeded
        self.lost = 0  # acknowledged writes missing after reopening
        self.wrong = 0  # answers that differ from the model, anywhere
        self.crash_reappeared = 0  # LogFailed, crash before any retry: the write came back
        self.crash_checked = 0
        self.problems: list[str] = []

    def check(self, live, model: Model, where: str, light: bool = False) -> None:
        diff = differences(live, model, queries(model, XQ), *((0, 2), (1, 5)) if light else ())
        if diff:
            ids, words = model.arrays()
            found = live.range_search(words, 0)
            missing = [int(i) for q, i in enumerate(ids)
                       if i not in np.asarray(found[2])[found[0][q]:found[0][q + 1]]]
            self.lost += len(missing)
            self.wrong += 1
            self.problems.append(f"{where}: missing {missing}; " + "; ".join(diff)[:400])


def copy_base(base: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base, dst)
    return dst


def open_live(directory: Path, mode: str, case: Case) -> LiveIndex:
    return LiveIndex(directory, BITS, mode, **case.options())


def trace(case: Case, base: Path, work: Path, mode: str) -> list[tuple[str, str]]:
    d = copy_base(base, work / "trace")
    rec = Recorder()
    if case.opens:
        case.prepare(d)
        with fsio.inject(rec):
            open_live(d, mode, case)
    else:
        live = open_live(d, mode, case)
        with fsio.inject(rec):
            perform(case, live)
        live.close()
    return rec.calls


def run_one(case: Case, mode: str, base: Path, work: Path, base_model: Model, plan: FaultPlan,
            label: str, out: Outcome, close_first: bool = False) -> bool:
    """One combination; True when the log was left fail-stopped (LogFailed). ``close_first``:
    then close the index (the disk works again) and reopen it before retrying."""
    d = copy_base(base, work / "run")
    model = base_model.copy()
    op = case.model_op()
    live = None
    raised = None
    if case.opens:
        case.prepare(d)
    else:
        live = open_live(d, mode, case)
    try:
        with fsio.inject(plan):
            if case.opens:
                live = open_live(d, mode, case)
            else:
                perform(case, live)
    except OSError as exc:  # AppendFailed, LogFailed, or the storage error of a merge / open
        raised = exc
    assert plan.fired, f"{label}: the fault never fired"
    if raised is None:
        out.absorbed[case.name] += 1
        if op is not None:
            model.apply(op)  # (a) acknowledged
    else:
        out.raised[case.name] += 1
    # (b) still searchable, equal to the model
    if live is not None:
        out.check(live, model, f"{label} (b) after the fault", light=True)
    # a crash now, with the log fail-stopped: the failed write may come back, nothing else
    if isinstance(raised, LogFailed):
        assert live.failed
        crashed = copy_base(d, work / "crashed")
        again = open_live(crashed, mode, case)
        got = resolve(again, model, [op] if op is not None else [], XQ)
        if not close_first:  # the same combination twice: count it once
            out.crash_checked += 1
            out.crash_reappeared += got is not model
        again.close()
        if close_first:  # a clean shutdown undoes the record: the failed write stays absent
            live.close()
            live = open_live(d, mode, case)
            out.check(live, model, f"{label} closed while fail-stopped, reopened")
    # (c) the fault is gone: the failed write retried, a new write and a merge succeed
    if live is None:
        live = open_live(d, mode, case)
    elif raised is not None and op is not None:
        perform(Case("retry", write=case.write), live)
        model.apply(op)
    if live.failed:
        out.problems.append(f"{label} (c): still fail-stopped after a successful write")
    perform(Case("write", write=("add", [200], [25])), live)
    model.apply(("add", np.array([200]), POOL[[25]]))
    live.merge()
    out.check(live, model, f"{label} (c) after retry + write + merge", light=True)
    live.close()
    # (d) reopened from disk
    again = open_live(d, mode, case)
    out.check(again, model, f"{label} (d) reopened")
    again.close()
    quarantined = [p.name for p in d.iterdir() if ".corrupt-" in p.name]
    if len(quarantined) > case.quarantined:
        out.problems.append(f"{label}: good snapshots set aside as corrupt: {quarantined}")
    # (e) the previous generation is usable: every snapshot left verifies, and with the newest
    # one damaged, recovery falls back to the previous one plus the log, losing nothing
    for snap in snapshots(d):
        try:
            snapshot.load(snap, BITS)
        except (OSError, ValueError) as exc:
            out.problems.append(f"{label} (e): {snap.name} kept but unusable: {exc}")
    corrupt_newest_snapshot(d)
    again = open_live(d, mode, case)
    out.check(again, model, f"{label} (e) newest snapshot corrupt, reopened", light=True)
    again.close()
    return isinstance(raised, LogFailed)


@pytest.fixture(autouse=True)
def fast_storage(monkeypatch):
    """fsync does nothing here (the page cache outlives a simulated crash: only a power loss
    needs it; the fault layer still sees every fsync call) and searches run on the calling
    thread: about four times faster, same storage calls."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setenv("BUCKETSEARCH_THREADS", "1")


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    out = {}
    for mode in ("single", "mih"):
        root = tmp_path_factory.mktemp(f"base-{mode}")
        out[mode] = (root, build_base(root, mode))
    return out


SUMMARY: dict[str, Outcome] = {}


@pytest.mark.parametrize("mode", ["single", "mih"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fault_at_every_call(case, mode, bases, tmp_path, capsys):
    base, base_model = bases[mode]
    calls = trace(case, base, tmp_path, mode)
    assert calls, f"{case.name} makes no storage call"
    out = SUMMARY.setdefault(mode, Outcome())
    out.points[case.name] += len(calls)
    stickies = (False, True) if mode == "single" else (False,)  # same storage path
    for n, (call, name) in enumerate(calls, 1):
        kinds = [k for sticky in stickies for k in kinds_for(call, sticky)]
        if case.background:  # the merge's calls with every kind: see "merge"; here EIO only
            kinds = [k for k in kinds if k[0] == "EIO"]
        for kind, spec in kinds:
            plan = FaultPlan(at=n, **spec)
            label = (f"{mode} {case.name} call {n}/{len(calls)} ({call} {name}) {kind}"
                     f"{' sticky' if plan.sticky else ''}")
            out.runs[case.name] += 1
            if run_one(case, mode, base, tmp_path, base_model, plan, label, out):
                # fail-stopped: again, closing and reopening before the retry
                run_one(case, mode, base, tmp_path, base_model, FaultPlan(at=n, **spec),
                        label + " then closed", out, close_first=True)
                out.runs[case.name] += 1
    assert not out.problems, "\n".join(out.problems[:20])


def test_snapshot_save_over_an_existing_one(tmp_path, capsys):
    """``save_arrays`` over an existing snapshot: after a fault at any call the path holds the
    old or the new snapshot, complete (never missing, never a mix), and no temporary
    directory is left."""
    path = tmp_path / "snap"
    old = {"a": np.arange(5), "b": np.ones((3, 2))}
    new = {"a": np.arange(7), "b": np.zeros((4, 2)), "c": np.arange(3, dtype=np.uint64)}
    save_arrays(path, "test", {"v": 1}, old)
    rec = Recorder()
    with fsio.inject(rec):
        save_arrays(path, "test", {"v": 2}, new)
    runs = raised = 0
    problems = []
    for n, (call, name) in enumerate(rec.calls, 1):
        for kind, spec in kinds_for(call) + kinds_for(call, sticky=True):
            shutil.rmtree(tmp_path, ignore_errors=True)
            tmp_path.mkdir()
            save_arrays(path, "test", {"v": 1}, old)
            plan = FaultPlan(at=n, **spec)
            try:
                with fsio.inject(plan):
                    save_arrays(path, "test", {"v": 2}, new)
            except OSError:
                raised += 1
            assert plan.fired
            runs += 1
            label = f"save call {n} ({call} {name}) {kind}{' sticky' if plan.sticky else ''}"
            aside = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
            if plan.sticky and not path.exists() and len(aside) == 1:
                aside[0].rename(path)  # even the undo rename failed: the old one is kept aside
            try:
                _, meta, arrays = load_arrays(path)
            except (OSError, ValueError) as exc:
                problems.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            want = new if meta["v"] == 2 else old
            if set(arrays) != set(want) or not all(np.array_equal(arrays[k], want[k])
                                                   for k in want):
                problems.append(f"{label}: a mix of the old and the new snapshot")
            leftovers = [p.name for p in tmp_path.iterdir() if p.name != "snap"]
            if leftovers:
                problems.append(f"{label}: left {leftovers}")
    SUMMARY.setdefault("store", Outcome()).runs["snapshot-save"] += runs
    SUMMARY["store"].raised["snapshot-save"] += raised
    SUMMARY["store"].points["snapshot-save"] += len(rec.calls)
    assert not problems, "\n".join(problems)


def test_zz_summary(capsys):
    """The figures of the matrix (after the tests above, in file order)."""
    if not SUMMARY:
        pytest.skip("the matrix did not run")
    lines = []
    total_runs = sum(sum(o.runs.values()) for o in SUMMARY.values())
    total_points = sum(sum(o.points.values()) for o in SUMMARY.values())
    ops = sorted({c for o in SUMMARY.values() for c in o.runs})
    lost = sum(o.lost for o in SUMMARY.values())
    wrong = sum(o.wrong for o in SUMMARY.values())
    for mode, o in SUMMARY.items():
        for c in sorted(o.runs):
            lines.append(f"  {mode:6s} {c:22s} points {o.points[c]:3d}  combinations "
                         f"{o.runs[c]:4d}  raised {o.raised[c]:4d}  absorbed {o.absorbed[c]:4d}")
    crash = sum(o.crash_checked for o in SUMMARY.values())
    back = sum(o.crash_reappeared for o in SUMMARY.values())
    with capsys.disabled():
        print("\n" + "\n".join(lines))
        print(f"faults injected: {total_runs} combinations ({len(ops)} operations, "
              f"{total_points} fault points, kinds ENOSPC/EIO/short write/EMFILE, once or "
              f"sticky), acknowledged writes lost: {lost}, wrong answers: {wrong}; "
              f"fail-stopped logs crashed before a retry: {crash}, "
              f"failed write back after that crash: {back}")
    assert lost == 0 and wrong == 0


# ------------------------------------------------- regressions found by the matrix, explicitly
def test_an_io_error_while_opening_quarantines_no_snapshot(tmp_path):
    """Was: a read error (EIO, EMFILE) on a snapshot during recovery renamed that good snapshot
    to ``.corrupt-*``; with the error on both generations the index could not be opened any
    more once the disk recovered. Now an I/O error is reported as such (retryable) and only
    damaged content is set aside."""
    model = build_base(tmp_path / "index", "single")
    before = sorted(p.name for p in (tmp_path / "index").iterdir())
    with pytest.raises(OSError, match="cannot open the index") as info, fsio.inject(
            FaultPlan(at=1, ops=("read",), errno=errno.EIO, sticky=True)):
        LiveIndex(tmp_path / "index", BITS, "single", **KW)
    assert not isinstance(info.value, ValueError)  # not CorruptIndexError
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == before
    with fsio.inject(FaultPlan(at=1, ops=("read",), errno=errno.EMFILE)):  # once: falls back
        live = LiveIndex(tmp_path / "index", BITS, "single", **KW)
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == before
    assert_matches(live, model, XQ)
    live.close()
    assert_matches(LiveIndex(tmp_path / "index", BITS, "single", **KW), model, XQ)


def test_a_snapshot_never_verified_is_not_kept_as_the_previous_generation(tmp_path):
    """Was: cleanup kept "the two newest snapshots", also one that recovery had skipped as
    corrupt (its quarantine rename failed) and deleted the verified one before it with the
    log after it; a corrupt newest snapshot then had nothing to fall back to."""
    d = tmp_path / "index"
    model = build_base(d, "single")
    corrupt_newest_snapshot(d)
    with fsio.inject(FaultPlan(at=1, ops=("rename",), errno=errno.EIO)):  # stays in place
        live = LiveIndex(d, BITS, "single", **KW)
    assert live.recovery.fallbacks and len(snapshots(d)) == 2
    live.add(POOL[[26]], [300])
    model = model.applied(("add", np.array([300]), POOL[[26]]))
    live.merge()
    live.close()
    kept = snapshots(d)
    for snap in kept:
        snapshot.load(snap, BITS)  # both generations verify
    corrupt_newest_snapshot(d)
    assert_matches(LiveIndex(d, BITS, "single", **KW), model, XQ)


def test_a_failed_swap_puts_the_previous_snapshot_back(tmp_path):
    """Was: ``save_arrays`` over an existing snapshot moved the old one aside, and when the
    rename of the new one failed the path was left missing."""
    path = tmp_path / "snap"
    save_arrays(path, "test", {"v": 1}, {"a": np.arange(3)})
    with pytest.raises(OSError), fsio.inject(FaultPlan(at=2, ops=("rename",))):
        save_arrays(path, "test", {"v": 2}, {"a": np.arange(4)})
    assert load_arrays(path)[1] == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["snap"]


def test_closing_a_fail_stopped_index_undoes_the_failed_write(tmp_path):
    """Was: after LogFailed (fsync and truncate failed), a clean close and reopen replayed the
    failed write's complete record: the client was told "failed", the index had it."""
    live = LiveIndex(tmp_path, BITS, "single", **KW)
    live.add(POOL[[0]], [0])
    with pytest.raises(LogFailed), fsio.inject(
            FaultPlan(at=1, ops=("fsync", "truncate"), errno=errno.EIO, sticky=True)):
        live.add(POOL[[1]], [1])
    assert live.failed and live.ntotal == 1
    live.close()  # the disk works again
    again = LiveIndex(tmp_path, BITS, "single", **KW)
    assert_matches(again, Model(BITS, {0: tuple(int(x) for x in POOL[0])}), XQ)
    again.add(POOL[[1]], [1])  # the retry: once
    again.close()
    assert LiveIndex(tmp_path, BITS, "single", **KW).ntotal == 2
