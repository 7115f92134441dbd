"""Storage: the live index of one folder and the data directory around it.

The state and its transitions (state), the folder's file names (layout), the write-ahead log
(wal), snapshots (snapshot), recovery, the commit position followers read (follow), the
coordinator (live), the on-disk catalog of indexes (catalog), backups and snapshot tars
(backup, exports), dedup on ingest (dedup) and the offline repair tool (repair).

The I/O layer and the snapshot arrays moved to the floor below the engines (issue 29):
``bucketsearch.index.storage.fsio`` and ``bucketsearch.index.storage.store`` stay importable
as the same module objects as :mod:`bucketsearch.index.disk.fsio` and
:mod:`bucketsearch.index.disk.store` (a fault plan injected through either name is one plan).
"""
import sys

from bucketsearch.index.disk import fsio, store

sys.modules[__name__ + ".fsio"] = fsio
sys.modules[__name__ + ".store"] = store
