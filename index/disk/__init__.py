"""The ground floor of the index: every storage call through one fault-injectable layer
(:mod:`~bucketsearch.index.disk.fsio`) and checksummed directories of arrays
(:mod:`~bucketsearch.index.disk.store`), below the engines that save and load themselves with
them; and the memory those arrays live in made huge pages (:mod:`~bucketsearch.index.disk.
hugepages`). Imports nothing of bucketsearch but itself."""
