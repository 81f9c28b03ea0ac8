# Spindle: `make demo` sets everything up and runs the demo; `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
CARGO ?= cargo

.PHONY: setup demo test test-rust test-python lint bench clean

setup: $(VENV)/.installed
	@command -v $(CARGO) >/dev/null || { echo "error: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }
	$(CARGO) build --release --locked -p spindle-cli
	install -m 755 target/release/spindle $(VENV)/bin/spindle

$(VENV)/.installed: requirements.lock python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e python
	touch $@

# k-means on generated data (the issue's size: 500,000 points x 50 dims, k = 25) on cloud threads.
demo: setup
	$(VENV)/bin/spindle run examples/kmeans.py --points 500000 --dims 50 -k 25 --threads 2 --iterations 10

test: setup lint test-rust test-python

test-rust:
	$(CARGO) test --release --locked --workspace

test-python:
	$(PY) -m pytest tests

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings

# Benchmarks run beside the real peers: redis-server and GNU parallel from Debian's packages; Ray, Lithops and
# PySpark (Java 17) from requirements-bench.lock, never part of `make test`.
bench: setup
	command -v redis-server >/dev/null && command -v parallel >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq redis-server parallel; }
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock -r requirements-bench.lock
	$(PY) bench/objects.py
	$(PY) bench/shared.py
	$(PY) bench/functions.py
	$(PY) bench/ml.py
	$(PY) bench/santa.py
	$(PY) bench/durability.py
	$(PY) bench/shell.py
	$(CARGO) build --release --locked -p spindle-loadgen
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) target
