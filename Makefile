# Two jobs: `make demo` (the main job) and `make test` (CI runs it and `make test-long`). Both
# create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

# `make coverage-kernels`: the tests that compare the numba kernels with their plain-numpy twins,
# run with NUMBA_DISABLE_JIT=1 so that the kernel bodies execute as Python and coverage sees
# them (a compiled body is invisible to it), with fewer hypothesis examples (pure-Python kernels
# are slow). Fails when the line and branch coverage of KERNEL_MODULES drops under
# KERNEL_COVERAGE_MIN, a little under the figure measured (92.6-93.1%, README, Development).
KERNEL_TESTS := tests/test_kernels.py tests/test_engine.py tests/test_mih.py tests/test_mih_small.py \
	tests/test_planner.py tests/test_codes.py tests/test_metrics_properties.py tests/test_metrics.py \
	tests/test_builds.py tests/test_costmodel.py::test_row_bounds_match_a_scan \
	tests/test_costmodel.py::test_run_bounds_at_a_position_match_a_scan \
	tests/test_merge_tables.py::test_merged_tables_are_the_tables_built_from_scratch \
	tests/test_merge_tables.py::test_the_remap_refuses_items_that_are_not_a_merge \
	tests/test_merge_tables.py::test_a_large_change_rebuilds
# (test_merge_tables' live-index tests, which calibrate auto, take minutes as plain Python)
# too slow as plain Python (balls of millions of masks, the planner's timed calibration, the
# planner's hypothesis test that builds three engines per example); `make test`'s compiled run
# has them
KERNEL_SKIP := tests/test_engine.py::test_largest_balls_exact[128-4] \
	tests/test_engine.py::test_largest_balls_exact[256-4] \
	tests/test_planner.py::test_calibration_and_prediction \
	tests/test_planner.py::test_auto_matches_scan
KERNEL_MODULES := index/_jit.py index/kernels.py index/table.py index/item_table.py index/radix.py \
	index/probe.py index/mih.py index/mih_tables.py \
	index/scan.py index/planner.py index/codes.py index/metrics/histogram.py index/metrics/ranking.py
KERNEL_COVERAGE_MIN := 91
KERNEL_EXAMPLES := 3
COVERAGE_DIR := out/coverage-kernels
comma := ,
space := $(subst ,, )
KERNEL_INCLUDE := $(subst $(space),$(comma),$(strip $(KERNEL_MODULES)))

.PHONY: demo test test-long coverage-kernels bench clean clean-cache

# first use: about a minute; pip prints each package as it goes (no silent stretch)
$(STAMP): pyproject.toml
	@echo "== $(VENV): creating it, then installing bucketsearch and its dependencies =="
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --progress-bar on --upgrade pip
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	@echo "== $(VENV) ready =="
	touch $(STAMP)

# the demo leaves its server up (address and dashboard printed last) until Ctrl-C
demo: $(STAMP)
	$(VENV)/bin/bucketsearch demo --keep-serving

# `make test`: quick feedback, every test not marked slow or serial (pyproject.toml's markers), on
# every core: pytest-xdist, one test file per worker (a file's module fixtures, such as a module's
# server process, stay in one process). `make test-long`: the rest, one test at a time: the fault
# matrices, crash points, histories and model runs, the kill tests, Ray shards, the browser, the
# README's blocks, warm-up and the timing-sensitive tests (marker serial), then the kernels'
# coverage. CI (.ci/run) runs both; times in README, Development
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not slow and not serial'

test-long: $(STAMP)
	$(PY) -m pytest -q -m 'slow or serial'
	$(MAKE) coverage-kernels

coverage-kernels: $(STAMP)
	mkdir -p $(COVERAGE_DIR)
	NUMBA_DISABLE_JIT=1 HYPOTHESIS_MAX_EXAMPLES=$(KERNEL_EXAMPLES) \
		COVERAGE_FILE=$(COVERAGE_DIR)/.coverage $(PY) -m coverage run --branch \
		--include='$(KERNEL_INCLUDE)' -m pytest -q -p no:cacheprovider \
		$(KERNEL_TESTS) $(foreach test,$(KERNEL_SKIP),--deselect '$(test)')
	COVERAGE_FILE=$(COVERAGE_DIR)/.coverage $(PY) -m coverage report --precision=1 --show-missing \
		--skip-covered --fail-under=$(KERNEL_COVERAGE_MIN)

bench: $(STAMP)
	$(PY) bench/bench_engine.py

clean-cache:
	find index app loadtest bucketsearch -name '*.nb[ic]' -delete

clean: clean-cache
	rm -rf $(VENV) out bench/out .pytest_cache .hypothesis
