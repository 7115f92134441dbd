"""Model-based stateful test of the live index (hypothesis ``RuleBasedStateMachine``).

The machine drives a :class:`~bucketsearch.index.storage.live.LiveIndex` through inserts, deletes,
re-inserts of
deleted ids, explicit and background merges, crashes and injected storage faults, and compares
every search with brute force over a plain dict (``tests/storage_model.py``) after every step:
range search at radius 0, 1, 2 and k-NN for k = 1..5, ordered by (distance, id), for a few fixed
queries plus every live code, and ``ntotal``.

Crashes are :class:`~bucketsearch.index.storage.fsio.SimulatedCrash` raised at a chosen storage call
(the n-th call
of an add, a delete, a merge or of recovery itself, a write possibly half done) or between
operations; the object is then abandoned without ``close()`` and the index reopened from the
directory. Background merges are joined and switched off while a crash or a fault is armed, so
no thread of the "dead" process writes after the crash, and call counts are deterministic.
Faults are ENOSPC / EIO at the n-th call (once, or sticky until the operation returns), or a
short write: an operation that raises (AppendFailed, LogFailed, OSError) leaves the model
unchanged, one that returns is acknowledged. An operation interrupted by a crash, or failed
while the log could not be restored (LogFailed), is *in limbo*: after the next recovery it may
be present or absent (never beside its retry); every acknowledged one must be present.

CI runs a fixed, derandomized budget (well under a minute). A longer, random run::

    BUCKETSEARCH_MODEL_EXAMPLES=2000 .venv/bin/python -m pytest tests/test_live_model.py -q

(the count applies to mode "single"; "mih" gets the same, "auto" a fifth: it re-calibrates the
planner at every merge). Hypothesis prints the shortest failing sequence; save it as an
explicit regression test below.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from storage_model import Model, assert_matches, clustered_pool, resolve

from bucketsearch.index.storage import fsio
from bucketsearch.index.storage.fsio import FaultPlan, SimulatedCrash
from bucketsearch.index.storage.live import DuplicateIdError, LiveIndex
from bucketsearch.index.storage.wal import AppendFailed, LogFailed

pytestmark = pytest.mark.slow  # slow: make test-long

ID_SPACE = 10  # small: conflicts, deletes of present ids and re-inserts happen often
POOL = 24
POOLS = {bits: clustered_pool(bits, POOL + 4, seed=bits) for bits in (16, 70)}

LONG = int(os.environ.get("BUCKETSEARCH_MODEL_EXAMPLES", "0"))
BUDGET = {"single": 40, "mih": 30, "auto": 6}


def _settings(mode: str) -> settings:
    examples = max(LONG // (5 if mode == "auto" else 1), 1) if LONG else BUDGET[mode]
    return settings(max_examples=examples, stateful_step_count=30, deadline=None,
                    derandomize=not LONG, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def note(what: str) -> None:
    """A hypothesis event (shown by ``--hypothesis-show-statistics``); a no-op outside a test."""
    try:
        event(what)
    except InvalidArgument:
        pass


#: The n-th storage call to hit: early ones (the WAL record, the rotation, recovery's reads)
#: as often as the rest of a merge (about 50 calls).
at_strategy = st.one_of(st.integers(1, 6), st.integers(1, 60))
ids_strategy = st.lists(st.integers(0, ID_SPACE - 1), min_size=1, max_size=4, unique=True)
rows_strategy = st.lists(st.integers(0, POOL - 1), min_size=4, max_size=4)


class LiveIndexMachine(RuleBasedStateMachine):
    mode = "single"

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="bs-model-"))
        self.live: LiveIndex | None = None
        self.limbo: list = []  # operations whose outcome the next recovery decides

    # ------------------------------------------------------------------------------- helpers
    def _open(self, background: bool | None = None) -> LiveIndex:
        kw = dict(self.kw)
        if background is not None:
            kw["background_merge"] = background
        return LiveIndex(self.dir, self.bits, self.mode, **kw)

    def _quiesce(self) -> None:
        """Join a running background merge and keep new ones from starting (a fault or a crash
        is about to be armed: only the operation under test may make storage calls)."""
        self.live.wait_for_merge()
        self.live.background_merge = False

    def _resume(self) -> None:
        if self.live is not None:
            self.live.background_merge = self.kw["background_merge"]

    def _acknowledged(self, op) -> None:
        self.model.apply(op)
        self._settled()

    def _settled(self) -> None:
        """A log that is not failed holds no unrestored record: nothing is in limbo."""
        if self.live is not None and not self.live.failed:
            self.limbo = []

    def _recovered(self, live: LiveIndex) -> None:
        self.live = live
        model = resolve(live, self.model, self.limbo, self.xq)
        if self.limbo:
            note("limbo: an unacknowledged write " + ("survived" if model is not self.model
                                                       else "is absent") + " after recovery")
        self.model = model
        self.limbo = []

    def _add_op(self, ids, rows):
        fresh = [i for i in ids if i not in self.model.items]
        if not fresh:
            return None
        return ("add", np.array(fresh, dtype=np.int64), self.pool[rows[:len(fresh)]])

    def _delete_op(self, ids):
        present = [i for i in ids if i in self.model.items]
        return ("delete", np.array(present, dtype=np.int64)) if present else None

    def _upsert_op(self, ids, rows):
        return ("upsert", np.array(ids, dtype=np.int64), self.pool[rows[:len(ids)]]) \
            if ids else None

    def _op_for(self, point, ids, rows):
        return {"add": self._add_op, "delete": lambda i, r: self._delete_op(i),
                "upsert": self._upsert_op}.get(point, lambda i, r: None)(ids, rows)

    def _run(self, op) -> None:
        if op[0] == "add":
            assert self.live.add(op[2], op[1]) == len(op[1])
        elif op[0] == "upsert":
            replaced = sum(int(i) in self.model.items for i in op[1])
            assert self.live.upsert(op[2], op[1]) == (len(op[1]) - replaced, replaced)
        else:
            assert self.live.delete(op[1]) == len(op[1])

    # --------------------------------------------------------------------------------- rules
    @initialize(bits=st.sampled_from([16, 70]), threshold=st.integers(2, 6),
                background=st.booleans())
    def start(self, bits, threshold, background):
        self.bits = bits
        self.pool = POOLS[bits][:POOL]
        self.xq = POOLS[bits][POOL:]
        self.kw = dict(merge_threshold=threshold, background_merge=background)
        self.model = Model(bits)
        self.live = self._open()

    @rule(ids=ids_strategy, rows=rows_strategy)
    def add(self, ids, rows):
        words = self.pool[rows[:len(ids)]]
        if any(i in self.model.items for i in ids):
            with pytest.raises(DuplicateIdError):
                self.live.add(words, ids)
        else:
            assert self.live.add(words, ids) == len(ids)
            self._acknowledged(("add", np.array(ids), words))

    @rule(ids=st.lists(st.integers(0, ID_SPACE + 1), max_size=4))
    def delete(self, ids):
        present = sorted({i for i in ids if i in self.model.items})
        assert self.live.delete(ids) == len(present)
        if present:
            self._acknowledged(("delete", np.array(present)))

    @rule(i=st.integers(0, ID_SPACE - 1), row=st.integers(0, POOL - 1))
    def delete_and_reinsert(self, i, row):
        """The same id again (new or same code): k-NN once omitted it until the next merge."""
        if i in self.model.items:
            assert self.live.delete([i]) == 1
            self._acknowledged(("delete", np.array([i])))
        words = self.pool[[row]]
        assert self.live.add(words, [i]) == 1
        self._acknowledged(("add", np.array([i]), words))

    @rule(ids=ids_strategy, rows=rows_strategy)
    def upsert(self, ids, rows):
        """Insert or replace in one record; applied twice, the same state."""
        op = self._upsert_op(ids, rows)
        if op is not None:
            self._run(op)
            self._acknowledged(op)

    @rule(mode=st.sampled_from(["single", "mih", "auto"]))
    def set_mode(self, mode):
        """A rebuild in place: same items, another engine; a reopen keeps the new mode."""
        if self.live.failed:
            with pytest.raises(LogFailed):
                self.live.set_mode(mode)
            return
        self.live.set_mode(mode)
        assert self.live.mode == mode

    @rule()
    def merge(self):
        if self.live.failed:  # the log could not be restored: rotation is refused
            try:
                self.live.merge()
            except LogFailed:
                pass
            return
        self.live.merge()
        assert not len(self.live.state.delta_ids) or self.kw["background_merge"]

    @rule()
    def wait_for_background_merge(self):
        self.live.wait_for_merge()

    @rule(point=st.sampled_from(["idle", "add", "delete", "upsert", "merge", "set_mode",
                                 "open"]),
          at=at_strategy, short=st.booleans(), ids=ids_strategy, rows=rows_strategy)
    def crash(self, point, at, short, ids, rows):
        """The process dies at the ``at``-th storage call of ``point`` (or after it when it
        makes fewer calls), then the index is reopened from the directory."""
        self._quiesce()
        plan = FaultPlan(at=at, crash=True, short=short)
        op = self._op_for(point, ids, rows)
        before = self.live.mode
        try:
            with fsio.inject(plan):
                if op is not None:
                    self._run(op)
                elif point == "merge":
                    self.live.merge()
                elif point == "set_mode":
                    self.live.set_mode("mih" if before != "mih" else "single")
        except SimulatedCrash:
            note(f"crash: {point} interrupted")
            if op is not None:
                self.limbo.append(op)
        except LogFailed:  # a merge or mode change while the log is fail-stopped: refused
            assert point in ("merge", "set_mode") and self.live.failed
        else:
            if op is not None:
                self._acknowledged(op)
        self.live = None  # abandoned without close(): the process is gone
        if point == "open":  # and the restart crashes too, at the at-th call of recovery
            try:
                with fsio.inject(plan):
                    self._open(background=False)
            except SimulatedCrash:
                note("crash: recovery interrupted")
        self._recovered(self._open())

    @rule(point=st.sampled_from(["add", "delete", "upsert", "merge", "open"]), at=at_strategy,
          err=st.sampled_from([errno.ENOSPC, errno.EIO]), short=st.booleans(),
          sticky=st.booleans(), ids=ids_strategy, rows=rows_strategy)
    def fault(self, point, at, err, short, sticky, ids, rows):
        """A storage fault under one operation; afterwards the disk works again."""
        self._quiesce()
        plan = FaultPlan(at=at, errno=err, short=short, sticky=sticky)
        op = self._op_for(point, ids, rows)
        if point == "open":
            self.live = None  # abandoned (a restart), reopened under the fault
            try:
                with fsio.inject(plan):
                    live = self._open(background=False)
            except OSError as exc:
                note(f"fault: recovery failed ({type(exc).__name__})")
                live = self._open(background=False)
            self._recovered(live)
        elif op is not None:
            was_failed = bool(self.live.failed)
            try:
                with fsio.inject(plan):
                    self._run(op)
            except LogFailed:
                note(f"fault: {op[0]} LogFailed (fail-stop)")
                assert self.live.failed
                self.limbo.append(op)
            except AppendFailed:
                note(f"fault: {op[0]} AppendFailed")
                assert was_failed or not self.live.failed  # failed stays until a restore
                self._settled()
            else:
                self._acknowledged(op)
        elif point == "merge":
            try:
                with fsio.inject(plan):
                    self.live.merge()
            except OSError as exc:
                note(f"fault: merge failed ({type(exc).__name__})")
        self._resume()

    @rule()
    def close_and_reopen(self):
        self.live.close()  # a fail-stopped log retries its undo: the failed write is gone
        self._settled()
        self._recovered(self._open())

    # ---------------------------------------------------------------------------- invariants
    @invariant()
    def nothing_quarantined(self):
        """No file here is ever damaged, so no snapshot may be set aside as corrupt."""
        assert not [p.name for p in self.dir.iterdir() if ".corrupt-" in p.name]

    @invariant()
    def answers_equal_brute_force(self):
        if self.live is not None:
            assert_matches(self.live, self.model, self.xq)

    def teardown(self):
        if self.live is not None:
            self.live.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class MihMachine(LiveIndexMachine):
    mode = "mih"


class AutoMachine(LiveIndexMachine):
    mode = "auto"


TestSingle = LiveIndexMachine.TestCase
TestSingle.settings = _settings("single")
TestMih = MihMachine.TestCase
TestMih.settings = _settings("mih")
TestAuto = AutoMachine.TestCase
TestAuto.settings = _settings("auto")


# ------------------------------------------------------------------- explicit regressions
@pytest.mark.parametrize("mode", ["single", "mih", "auto"])
def test_knn_finds_an_id_deleted_and_inserted_again(tmp_path, mode):
    """The bug fixed with the rewrite: after deleting an id of the main index and inserting it
    again, k-NN omitted the new copy until the next merge."""
    pool = POOLS[16]
    live = LiveIndex(tmp_path, 16, mode, background_merge=False)
    live.add(pool[:4], [0, 1, 2, 3])
    live.merge()
    assert live.delete([2]) == 1
    live.add(pool[[2]], [2])  # same code again
    model = Model(16, {i: tuple(int(x) for x in pool[i]) for i in range(4)})
    assert_matches(live, model, pool[POOL:])
    assert live.delete([1]) == 1
    live.add(pool[[7]], [1])  # another code
    model.apply(("delete", [1]))
    model.apply(("add", [1], pool[[7]]))
    assert_matches(live, model, pool[POOL:])
    live.close()
    assert_matches(LiveIndex(tmp_path, 16, mode, background_merge=False), model, pool[POOL:])
