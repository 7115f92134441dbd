"""Evaluation built on the metric formulas of :mod:`bucketsearch.index.metrics`: the ``eval``
and ``compare`` commands (evalcmd, comparecmd), coding strategies (coding), data sets
(datasets), hash-table buckets (buckets), the frontier, significance tests, presets, TREC
files, the advisor, the reproduction of the papers' numbers (reproduce) and the engine demo
(demo). Relevance judgments live with the formulas that read them
(:mod:`bucketsearch.index.metrics.relevance`), synthetic codes beside the codes
(:mod:`bucketsearch.index.synth`)."""

import sys

from bucketsearch.index import synth
from bucketsearch.index.metrics import relevance

# moved in issue 29 (relevance to the formulas it feeds, synthetic codes beside the codes):
# the old names stay importable as the same module objects
sys.modules[__name__ + ".relevance"] = relevance
sys.modules[__name__ + ".synth"] = synth
