"""Storage: the fault-injectable I/O layer (fsio), the write-ahead log (wal), snapshot arrays
(store), the live index over them (live), the on-disk catalog of indexes (catalog) and the
offline repair tool (repair)."""
