"""bucketsearch engine: Hamming-space bucket search over binary codes, and its evaluation.

Main entry points (imported lazily so ``import index`` stays cheap)::

    from index.probe import HammingIndex   # single-table bucket search (hash lookup)
    from index.scan import LinearScan      # popcount linear scan (Hamming ranking)
    from index.codes import as_words       # code formats and bit order
"""

__version__ = "0.1.0"
