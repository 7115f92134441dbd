"""The cost model of a search: one package owns its estimators, fits and verdicts; the server
(app/costfit.py), the load-test report, ``eval --measured-cost`` and the demo call it, and every
figure names the estimator that made it (docs/cost-model.md).

* :mod:`~bucketsearch.index.fits.paper`: the RAMAP paper's ``T(R) = t0 sum_{r<=R} C(Q, r)``;
  estimator ``radius_fit``.
* :mod:`.microbench`: estimator ``microbenchmark`` (empty and non-empty probes timed apart).
* :mod:`~bucketsearch.index.fits.regression`: least squares with intervals and the
  identifiability rule.
* :mod:`.estimators`: per-query samples, the ``query_model`` (fixed, per probe, per item, per
  candidate), the per-radius table, :func:`fit_all` and :func:`describe`.
* :mod:`~bucketsearch.index.fits.stepmodel`: the planner's per-radius-step model
  (``step_model``).
* :mod:`.report`: modeled vs measured per radius of any index, offline (table and PNG).
* :mod:`.study`: where the paper's model holds, per study cell (``bench/study_costmodel.py``):
  ``T(R)/T(0)`` against ``sum C(Q, i)``, the extended model on relative errors, the verdict.

The fitting formulas (paper, regression, stepmodel) live on the ground floor,
:mod:`bucketsearch.index.fits`, so the planner predicts with them without importing this
package (which imports the engines it measures); the old module names stay importable.
"""
from bucketsearch.index.costmodel.estimators import (DEFAULT_QUERY_TERMS, HOLDS_FACTOR, QUERY_MODEL,
                                                     QUERY_TERMS, CostSamples, QueryModel,
                                                     as_samples, describe, fit_all, fit_query_model,
                                                     measured_row, paper_columns, radius_rows,
                                                     summary, t0_agreement, t0_from_query_model,
                                                     t0_radius_fit)
from bucketsearch.index.costmodel.microbench import (MICROBENCHMARK, microbenchmark_t0,
                                                     mix_probe_times, probe_microbenchmark)
from bucketsearch.index.fits.paper import (RADIUS_FIT, PaperModel, T0Estimate, fit_paper_model,
                                                fit_t0, paper_probes, per_radius_means, r_squared,
                                                radius_fit, radius_fit_from_sums, reached_mask,
                                                relative_errors)
from bucketsearch.index.fits.regression import (COND_MAX, CONFIDENCE, LinearFit,
                                                     condition_index, fit_linear, select_terms,
                                                     t_quantile)
from bucketsearch.index.costmodel.report import cost_report, plot_reports, print_report
from bucketsearch.index.fits.stepmodel import (EXTENDED_TERMS, ExtendedModel, fit_extended,
                                                    stats_features)

__all__ = [
    "COND_MAX", "CONFIDENCE", "DEFAULT_QUERY_TERMS", "EXTENDED_TERMS", "HOLDS_FACTOR",
    "MICROBENCHMARK", "QUERY_MODEL", "QUERY_TERMS", "RADIUS_FIT", "CostSamples", "ExtendedModel",
    "LinearFit", "PaperModel", "QueryModel", "T0Estimate", "as_samples", "condition_index",
    "cost_report", "describe", "fit_all", "fit_extended", "fit_linear", "fit_paper_model",
    "fit_query_model", "fit_t0", "measured_row", "microbenchmark_t0", "mix_probe_times",
    "paper_columns", "paper_probes", "per_radius_means", "plot_reports", "print_report",
    "probe_microbenchmark", "r_squared", "radius_fit", "radius_fit_from_sums", "radius_rows",
    "reached_mask", "relative_errors", "select_terms", "stats_features", "summary",
    "t0_agreement", "t0_from_query_model", "t_quantile",
    "t0_radius_fit",
]

import sys as _sys  # noqa: E402

from bucketsearch.index.fits import paper, regression, stepmodel  # noqa: E402

for _module in (paper, regression, stepmodel):  # same module objects under the old names
    _sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
