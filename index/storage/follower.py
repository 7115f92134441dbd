"""Following the writer: the part of :class:`~bucketsearch.index.storage.live.LiveIndex` that
publishes its commit position (a writer) or applies what the writer committed (a read-only
index: a follower, the read replicas of ``--workers N`` and of a shard).

The position file and reading the log up to it: :mod:`bucketsearch.index.storage.follow`.
The state a follower publishes is made by the same pure transition the writer uses
(:func:`~bucketsearch.index.storage.state.apply_ops`), one reference swapped: a search never
sees half of a catch-up.
"""
from __future__ import annotations

import time

from bucketsearch.index.errors import CorruptIndexError, CorruptLogError, FollowerStopped
from bucketsearch.index.storage import follow
from bucketsearch.index.storage.state import apply_ops


class Follower:
    """Mixin of :class:`~bucketsearch.index.storage.live.LiveIndex` (its attributes
    ``directory, read_only, state, _wal, _applied, _caught_up_at, _verified_snapshot,
    follow_stopped``): the commit position and catching up."""

    def _publish_position(self) -> None:
        """Writer: the commit position for followers (:mod:`~bucketsearch.index.storage.follow`)."""
        follow.write_position(self.directory, follow.Position(
            self._wal.seq, self._wal.size, self._verified_snapshot))

    @property
    def applied(self) -> follow.Position:
        """The log position this index has applied (a writer: all it acknowledged)."""
        if self._wal is not None:
            return follow.Position(self._wal.seq, self._wal.size, self._verified_snapshot)
        return self._applied

    @property
    def lag_ms(self) -> float:
        """A follower's staleness bound: ms since a catch-up last found nothing newer (0 for
        the writer)."""
        if self._wal is not None:
            return 0.0
        return (time.monotonic() - self._caught_up_at) * 1e3

    def catch_up(self) -> bool:
        """Follower (read-only): apply the records the writer committed since the last call,
        or reload from the newest snapshot after a merge (or when the log went back: a repair
        or a restored folder). Returns whether the state changed. A failure (raised) leaves the
        state as it was, to be retried; damage in what the writer committed
        (:class:`~bucketsearch.index.storage.wal.CorruptLogError`, :class:`CorruptIndexError`)
        stops the follower for good (``follow_stopped`` says why; every later call raises
        :class:`FollowerStopped`): it never applies a record past a damaged one. Opening the
        folder afresh (after ``bucketsearch repair`` on the writer's side) follows again."""
        if not self.read_only:
            return False
        if self.follow_stopped is not None:
            raise FollowerStopped(self.follow_stopped)
        checked = time.monotonic()
        pos = follow.read_position(self.directory)
        if pos is None or pos == self._applied:
            self._caught_up_at = checked
            return False
        try:
            if pos.snapshot != self._applied.snapshot or pos[:2] < self._applied[:2]:
                self._reload()
            else:
                try:
                    ops = follow.read_committed(self.directory, self._applied, pos)
                except FileNotFoundError:  # cleaned up after a merge we have not loaded yet
                    self._reload()
                else:
                    state = self.state
                    self.state = apply_ops(state, ops, check=False) if ops else state
                    self._applied = pos
        except (CorruptLogError, CorruptIndexError) as exc:
            self.follow_stopped = f"following the writer stopped: {exc}"  # never skip past it
            raise FollowerStopped(self.follow_stopped) from exc
        self._caught_up_at = checked
        return True

    def _reload(self) -> None:
        """Follower: open the directory afresh (newest snapshot + committed log) and adopt it."""
        fresh = type(self)(self.directory, self.bits, self.mode, self.substrings,
                           max_probes=self.max_probes, read_only=True, mmap=self.mmap,
                           background_merge=False)
        self.mode, self.substrings = fresh.mode, fresh.substrings
        self.recovery = fresh.recovery
        self.state, self._applied = fresh.state, fresh._applied
