"""The ground floor of the index: every storage call through one fault-injectable layer
(:mod:`~bucketsearch.index.disk.fsio`) and checksummed directories of arrays
(:mod:`~bucketsearch.index.disk.store`), below the engines that save and load themselves with
them. Imports nothing of bucketsearch but itself."""
