# One entry point. Every target sets up its virtualenv itself (scripts/venv.sh: a no-op when
# nothing changed). The tested stacks are constraints files named after the platforms they
# mirror (docs/reference/stacks.md): constraints.txt is the Petastorm stack (.venv, Python 3.11,
# pyspark 4.0, pyarrow 14), and STACK=name picks constraints-NAME.txt and .venv-NAME instead.
STACK ?=
VENV ?= $(if $(STACK),.venv-$(STACK),.venv)
CONSTRAINTS ?= $(if $(STACK),constraints-$(STACK).txt,constraints.txt)
PY := $(abspath $(VENV))/bin/python
# executors must run the venv's Python or they will not find the packages
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
# local runs stay on loopback
export SPARK_LOCAL_IP ?= 127.0.0.1
PYTEST_ARGS ?=
# Every stack but the Petastorm one: Spark 3.5 on Databricks 16.4 LTS ML (Python 3.12, pandas
# 1.5.3, pyarrow 15, torch 2.6) and EMR 7 (Python 3.11, numpy 1.26); Spark 4.0 on Databricks
# 17.3 LTS ML (Python 3.12, torch 2.7); Spark 4.1 on Fabric 2.0 (Python 3.13); the newest
# pyspark, pyarrow, numpy and pandas on Python 3.11 (current)
STACKS ?= dbr-16.4-ml emr-7 dbr-17.3-ml fabric-2.0 current
# The version tier: the tests whose code paths differ between the stacks (Spark 3.5 and 4.x,
# Python 3.10-3.13, pandas 1.5-2.x, numpy 1 and 2, pyarrow, torch 2.6-2.13), run on every
# stack but the Petastorm one, which runs the whole suite: the stack check; the Spark seam
# (sessions, the calls it makes, pyspark.ml persistence); conversions between Spark, Arrow,
# pandas, numpy and torch (the data plane's unit tests, the raw-columns path); the lakehouse
# readers (Delta, Iceberg); torch's APIs (the training step, FSDP2, torch.export, the ranks'
# shared memory (memfd and fd passing, Python 3.9+), SSP's refusal
# where TCPStore has no queues: SSP itself needs torch 2.13, the Petastorm stack's);
# Spark Connect; `run`, the TorchDistributor drop-in and the first fit through Spark;
# transform reading a Parquet table where it lies (_metadata.row_index: Spark 3.5; Arrow UDFs);
# the platforms' install lines (docs/install.md) against the stacks that mirror them
VERSION_TESTS ?= tests/unit/test_stack.py tests/unit/session tests/unit/data tests/unit/tables tests/unit/train \
	tests/unit/export tests/unit/ml tests/unit/strategies/test_fsdp.py tests/unit/task/test_host_memory.py \
	tests/unit/strategies/test_ssp.py::test_ssp_is_refused_by_name_on_a_torch_without_store_queues \
	$(foreach t,test_allreduce_sums_over_ranks test_unmodified_torchrun_function_trains_ddp \
	test_failing_rank_surfaces_with_its_traceback,"tests/integration/test_run.py::$(t)[local]") \
	tests/integration/test_raw_columns.py tests/integration/test_lakehouse.py \
	tests/integration/test_estimator.py::test_pipeline_fit_save_load_gives_identical_predictions \
	tests/integration/test_scoring.py::test_a_parquet_table_is_scored_where_it_lies_as_spark_would_hand_it_over \
	tests/integration/test_scoring.py::test_every_output_of_every_kind_of_model_is_what_the_module_gives \
	tests/integration/test_connect.py tests/integration/test_first_fit.py \
	tests/integration/test_distributor.py tests/integration/test_platform_install.py $(TIER_DOCS)
# the README's examples (the digits fit) as a newcomer runs them; every page runs on the
# Petastorm stack. Not the TorchDistributor page here: its first example is pyspark's own
# TorchDistributor, whose rank 0 picks MASTER_PORT by binding and releasing a port before
# torchrun binds it; on Spark 3.5 (emr-7) that page ran past its 240 s once in five tiers.
# The drop-in itself runs here through tests/integration/test_distributor.py
TIER_DOCS ?= "tests/integration/test_docs_examples.py::test_the_examples_run_as_written[README.md]" \
	tests/integration/test_docs_examples.py::test_the_process_that_ran_the_pages_ended_cleanly

.PHONY: venv venvs run test test-ci test-all test-pinned test-tiers test-stack test-stack-full \
	test-fast bench bench-peers bench-env plan clean docs docs-build docs-venv docs-serve wheel \
	lint lint-venv

venv:
	@SPARKDDL_VENV=$(VENV) SPARKDDL_CONSTRAINTS=$(CONSTRAINTS) scripts/venv.sh

run: venv
	$(VENV)/bin/sparkddl train conf/digits.toml

# the README's test command: the docs built with --strict and the whole suite on the Petastorm
# stack (the README's, the docs' and the notebook's examples included)
test: docs-build test-pinned

# what CI runs (.ci/run): `make lint` (under a minute), `make test`, then the version tier on
# every other stack, each virtualenv built right before its tests (all of them at once would
# put about 25 GB on disk while the suite runs)
test-ci: lint test test-tiers

# the whole suite on every stack: what a change to a dependency, a constraints file or the
# seam between Spark versions (sparkddl/session/) passes before it lands
test-all: test
	@set -e; for s in $(STACKS); do $(MAKE) --no-print-directory test-stack-full STACK=$$s; done

test-tiers:
	@set -e; for s in $(STACKS); do $(MAKE) --no-print-directory test-stack STACK=$$s; done

# one stack: `make test-stack STACK=emr-7` (the version tier), `make test-stack-full STACK=emr-7`
test-stack: venv
	@echo "== stack $(or $(STACK),petastorm): the version tier =="
	$(PY) -m pytest $(VERSION_TESTS) $(PYTEST_ARGS)

test-stack-full: venv
	@echo "== stack $(or $(STACK),petastorm): the whole suite =="
	$(PY) -m pytest $(PYTEST_ARGS)

# every virtualenv at once (about 25 GB): mostly downloads and unpacking, which overlap
venvs:
	@$(MAKE) --no-print-directory -j3 venv docs-venv $(addprefix venv-,$(STACKS))

venv-%:
	@$(MAKE) --no-print-directory venv STACK=$*

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
# executor (docs/install.md): pip's isolated build (setuptools and wheel from the registry), so
# no virtualenv of the project is needed first
wheel:
	rm -rf build dist/sparkddl-*.whl
	python3 -m pip wheel -q --disable-pip-version-check --no-deps -w dist .
	@ls dist/sparkddl-*.whl

# ruff over every Python folder and pyright over the package (pyproject.toml's [tool.ruff] and
# [tool.pyright]), from .venv-lint (constraints-lint.txt); pyright resolves imports in .venv,
# the pinned stack, whatever STACK says
LINT_PATHS ?= sparkddl tests benchmarks jobs scripts
lint-venv:
	@scripts/lint-venv.sh

lint: lint-venv
	@$(MAKE) --no-print-directory venv STACK=
	.venv-lint/bin/ruff check $(LINT_PATHS)
	.venv-lint/bin/pyright --pythonpath $(abspath .venv)/bin/python

test-pinned: venv
	$(PY) -m pytest $(PYTEST_ARGS)

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
	rm -rf .venv .venv-* .venv-docs .pytest_cache runs site build dist
