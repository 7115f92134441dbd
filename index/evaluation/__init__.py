"""Evaluation beyond the metric formulas of :mod:`bucketsearch.index.metrics`: relevance from
labels (relevance), coding strategies (coding), data sets (datasets, synth), the reproduction
of the papers' numbers (reproduce) and the engine demo (demo)."""
