"""The cost model's fitting formulas, on the ground floor (numpy and the standard library
only: they import nothing of bucketsearch but each other), so the planner predicts with them
below the cost model that measures the engines:

* :mod:`.regression`: least squares with intervals and the identifiability rule;
* :mod:`.paper`: the RAMAP paper's ``T(R) = t0 sum_{r<=R} C(Q, r)``, estimator ``radius_fit``;
* :mod:`.stepmodel`: the planner's per-radius-step model (``step_model``).

:mod:`bucketsearch.index.costmodel` re-exports them; ``bucketsearch.index.costmodel.paper``,
``.regression`` and ``.stepmodel`` name the same module objects.
"""
