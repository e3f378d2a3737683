# One entry point. Every target sets up its virtualenv itself (scripts/venv.sh: a no-op when
# nothing changed). Three tested stacks: constraints.txt (.venv, with Petastorm),
# constraints-current.txt (.venv-current: newest pyspark 4.x, pyarrow >= 18, numpy 2) and
# constraints-oldest.txt (.venv-oldest: the current stack with torch 2.4.1, the oldest admitted).
VENV ?= .venv
CONSTRAINTS ?= constraints.txt
PY := $(abspath $(VENV))/bin/python
# executors must run the venv's Python or they will not find the packages
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
# local runs stay on loopback
export SPARK_LOCAL_IP ?= 127.0.0.1
PYTEST_ARGS ?=
# The pinned stack runs the whole suite. The other two differ from it in a few packages, and
# run only the tests whose code paths depend on those (a path already proven on the pinned
# stack is not run again on the same code).
# current: pyspark 4.3, pyarrow 26, numpy 2, pandas 2.3, no Petastorm (the Arrow reader); the
# same torch and MLflow as pinned, so no strategy, export, channel, Horovod-API or tracking
# tests. The estimator's and TorchDistributor's paths run here through the first hour's docs
# examples (fit, transform; pyspark's and sparkddl's TorchDistributor) and the notebook
CURRENT_TESTS ?= tests/unit/data tests/unit/ml tests/unit/session tests/unit/launch \
	tests/unit/store tests/unit/cli tests/unit/checkpoint tests/unit/train \
	tests/unit/test_stack.py tests/unit/test_imports.py \
	tests/integration/test_run.py tests/integration/test_data.py \
	tests/integration/test_stack.py tests/integration/test_inplace.py \
	tests/integration/test_connect.py tests/integration/test_raw_columns.py \
	tests/integration/test_lakehouse.py tests/integration/test_notebook.py \
	tests/integration/test_first_fit.py $(CURRENT_DOCS)
# the docs' examples of a newcomer's first hour (every page runs on the pinned stack)
CURRENT_DOCS ?= $(foreach page,README.md docs/getting-started.md \
	docs/migrate/torchdistributor.md docs/migrate/petastorm.md,\
	"tests/integration/test_docs_examples.py::test_the_examples_run_as_written[$(page)]") \
	tests/integration/test_docs_examples.py::test_the_process_that_ran_the_pages_ended_cleanly
# oldest: the current stack with torch 2.4.1, so the tests of what touches torch's APIs: the
# strategies, the training step, the ranks' process groups, torch.export, Horovod's API, and
# the runner and every strategy through Spark (each a TorchEstimator fit)
OLDEST_TESTS ?= tests/unit/strategies tests/unit/train tests/unit/task tests/unit/horovod \
	tests/unit/export tests/unit/checkpoint tests/unit/channel tests/unit/ml \
	tests/unit/test_stack.py \
	tests/integration/test_run.py tests/integration/test_strategies_spark.py

.PHONY: venv venvs venv-current venv-oldest run test test-all test-pinned test-current pytest-current test-oldest pytest-oldest \
	test-fast bench bench-peers bench-env plan clean docs docs-build docs-venv docs-serve wheel

venv:
	@SPARKDDL_VENV=$(VENV) SPARKDDL_CONSTRAINTS=$(CONSTRAINTS) scripts/venv.sh

run: venv
	$(VENV)/bin/sparkddl train conf/digits.toml

# the README's test command: the docs built with --strict and the whole suite on the pinned
# stack (the README's, the docs' and the notebook's examples included)
test: docs-build test-pinned

# what CI runs (.ci/run): `make test`, then the current and the oldest stacks, each virtualenv
# built right before its tests. Not `venvs` first: that saved 226 s from a fresh clone, but it
# puts all four virtualenvs (about 12 GB, 6.5 of them the oldest stack's CUDA torch 2.4.1)
# on disk while the pinned suite runs, and CI's run of it failed mid-suite: from one test on,
# every test that needed a temporary folder errored (the disk full, by every sign)
test-all: test test-current test-oldest

# every virtualenv at once (about 12 GB): mostly downloads and unpacking, which overlap
venvs:
	@$(MAKE) --no-print-directory -j4 venv venv-current venv-oldest docs-venv

venv-current:
	@$(MAKE) --no-print-directory VENV=.venv-current CONSTRAINTS=constraints-current.txt venv

venv-oldest:
	@$(MAKE) --no-print-directory VENV=.venv-oldest CONSTRAINTS=constraints-oldest.txt venv

# the documentation site (docs/, mkdocs.yml) in .venv-docs: built with --strict (a broken link
# or reference fails), then checked in a headless Chromium (scripts/docs-check.sh)
docs-venv:
	@scripts/docs-venv.sh

docs-build: docs-venv
	@# not --quiet: with mkdocs 1.6 it lets --strict pass a build that has warnings
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict

docs: docs-build
	scripts/docs-check.sh

# the site at http://127.0.0.1:8000, rebuilt on every save
docs-serve: docs-venv
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs serve

# dist/sparkddl-<version>-py3-none-any.whl, the file to install on the driver and on every
# executor (docs/install.md); built offline with the venv's setuptools, from a clean build/
wheel: venv
	rm -rf build dist/sparkddl-*.whl
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	@ls dist/sparkddl-*.whl

test-pinned: venv
	$(PY) -m pytest $(PYTEST_ARGS)

test-current:
	@$(MAKE) --no-print-directory VENV=.venv-current CONSTRAINTS=constraints-current.txt \
		pytest-current

pytest-current: venv
	$(PY) -m pytest $(CURRENT_TESTS) $(PYTEST_ARGS)

test-oldest:
	@$(MAKE) --no-print-directory VENV=.venv-oldest CONSTRAINTS=constraints-oldest.txt \
		pytest-oldest

pytest-oldest: venv
	$(PY) -m pytest $(OLDEST_TESTS) $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: venv
	benchmarks/run_all.sh

# sparkddl side by side with the peers users would pick (Ray Train + Ray Data, TorchDistributor
# + Mosaic Streaming, TorchDistributor + Petastorm, a plain torch floor), in an environment of
# its own (.venv-bench: constraints.txt's stack plus the `bench` extra, pinned in
# constraints-bench.txt); never the runtime dependencies or the test path.
# PEERS_ARGS passes flags (--epochs 2 --tiles 112 ...)
PEERS_ARGS ?=
bench-env:
	@$(MAKE) --no-print-directory VENV=.venv-bench CONSTRAINTS=constraints-bench.txt venv
	@# PyPI's torchvision (Streaming imports it) cannot load its ops next to the CPU torch
	@.venv-bench/bin/python benchmarks/peers.py --install-torchvision-shim
	@.venv-bench/bin/python -c "import ray.train.torch, ray.data, streaming, psutil" \
		|| { echo ".venv-bench cannot import the peers; delete it and retry" >&2; exit 1; }

bench-peers: bench-env
	PYSPARK_PYTHON=$(abspath .venv-bench)/bin/python \
		PYSPARK_DRIVER_PYTHON=$(abspath .venv-bench)/bin/python \
		timeout 1200 .venv-bench/bin/python benchmarks/peers.py $(PEERS_ARGS)

plan: venv
	$(VENV)/bin/sparkddl plan conf/digits.toml

clean:
	rm -rf .venv .venv-current .venv-oldest .venv-bench .venv-docs .pytest_cache runs site build dist
