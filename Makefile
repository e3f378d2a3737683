# One entry point. Every target sets up .venv itself (scripts/venv.sh, a no-op when nothing changed).
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
# executors must run the venv's Python or they will not find the packages
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
# local runs stay on loopback
export SPARK_LOCAL_IP ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: venv run test test-fast bench clean

venv:
	@SPARKDDL_VENV=$(VENV) scripts/venv.sh

run: venv
	$(VENV)/bin/sparkddl train conf/digits.toml

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: venv
	$(PY) benchmarks/run_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache runs
