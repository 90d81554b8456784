# The README's two commands: `make demo` and `make test`. Each sets up .venv first if needed.
VENV ?= .venv
PY := $(VENV)/bin/python
# The demo writes only under this checkout (so per user and per checkout): two people or two checkouts
# on one machine never delete, overwrite or report each other's runs. Each `make demo` records into a
# new directory there and reports that one; nothing is deleted.
DEMO_DIR ?= $(CURDIR)/.demo
# The CPU wheel of torch that lies on this machine's disk; a torch already importable by python3
# (a CUDA build on a GPU host) is kept instead.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup setup-test demo test bench clean
# The demo needs the runtime and the report extras only (about 1 GB with torch's CPU wheel); the test
# extras (playwright, transformers, scipy, dash, the sglang contract wheel) come with `make test`.
# --no-warn-conflicts: the sglang wheel is installed without its GPU engine's dependencies on purpose
# (scripts/install_sglang_contract.sh), so pip's resolver would otherwise print a page of "sglang requires
# ..." lines on every install; nothing the project imports is concerned. PYTHONWARNINGS=ignore: setuptools'
# editable build prints a 10-line "Editable installation ... be careful" notice even under -q. -qq: errors
# only; a machine whose pip configuration names an index or find-links folder that is not there (seen on a
# fresh VM) got one WARNING line per package, 30 lines before the demo's first line.
PIP := PYTHONWARNINGS=ignore $(PY) -m pip install -qq --no-warn-conflicts
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if python3 -c "import torch" 2>/dev/null; then python3 -m venv --system-site-packages $(VENV); \
	  else python3 -m venv $(VENV); fi; fi
	@$(PIP) --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) $(TORCH_PIN)
	@$(PIP) -e '.[report]'
	@touch $@

setup-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	@$(PIP) -e '.[dev]'
	@PY=$(PY) bash scripts/install_sglang_contract.sh || echo "sglang not installed: its contract test will skip"
	@touch $@

# A short CPU training run with every offload flag (the recommended large-model configuration,
# host RAM short: state to disk), recorded with the heap sampled (so the report judges the host
# forecast), then its report written and checked.
DEMO_ARGS ?= --preset cpu --num-rollout 2 --offload-train --offload-rollout \
	--colocate-memory-peak-device gpu --offload-rollout-level kv_cache weight --optimizer-cpu-offload \
	--offload-train-target disk --offload-train-disk-dir $(DEMO_DIR)/offload

demo: setup
	@mkdir -p $(DEMO_DIR)
	logs=$$(mktemp -d $(DEMO_DIR)/logs-XXXXXX) && \
	$(PY) -m miles_profile.record --heap --log-dir $$logs -- $(DEMO_ARGS) && \
	$(PY) -m miles_profile.visualize $$logs -o $$logs/report.html

# The suite on one worker more than the cores (TEST_WORKERS=0 runs it in one process): many tests wait on
# programs that run in real time (paced training loops, Ray nodes, browsers), and the extra worker fills
# those waits (2 cores: 12 min 8 s with three workers against 13 min 25 s with two, back to back on an idle
# VM, 2026-12-06). tests/conftest.py keeps the tests of a module-scoped fixture on one worker and runs the
# slow end-to-end ones after the fast ones. It ends with the ten slowest tests (--durations=10).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# The suite starts hundreds of Python processes (recorders, trainers, reports, pytest's own workers). With
# PYTHONDONTWRITEBYTECODE set in the environment (as on the development VM) each one compiles every module of
# this checkout it imports, and each worker rewrites and compiles every test file; emptied, the first writes
# the caches (__pycache__/, ignored by git) and the rest read them.
test: setup-test
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=10

# Every benchmark, each printing ratios measured side by side (figures: docs/benchmarks.md,
# docs/trainer.md, docs/report.md, docs/dashboard.md, docs/forecast.md). Minutes; run on an idle machine.
bench: setup-test
	$(PY) bench/bench_sampler.py
	$(PY) bench/overhead_ab.py
	$(PY) bench/wake_cost.py
	$(PY) bench/bench_offload.py --preset cpu --disk-dir /tmp/bench-offload
	$(PY) bench/bench_visualize.py
	$(PY) bench/bench_dashboard.py
	$(PY) bench/bench_dist.py
	$(PY) bench/bench_summaries.py
	$(PY) bench/bench_compare.py
	$(PY) bench/bench_fleet.py
	$(PY) bench/bench_fleet_visualize.py
	$(PY) bench/bench_dashboard_fleet.py
	$(PY) bench/heap_probe_cost.py --rounds 3

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
