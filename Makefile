# Spindle: `make demo` sets everything up and runs the demo; `make test` runs every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
CARGO ?= cargo

.PHONY: setup demo test test-tools sabotage test-rust test-python lint bench clean pypy wasm

setup: $(VENV)/.installed wasm
	@command -v $(CARGO) >/dev/null || { echo "error: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }
	# The whole workspace: its dependencies then have the features `cargo test --workspace`
	# (test-rust) resolves, so the tests reuse this build instead of compiling it all again.
	$(CARGO) build --release --locked --workspace
	install -m 755 target/release/spindle $(VENV)/bin/spindle

$(VENV)/.installed: requirements.lock python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e python
	touch $@

# Compiled object types (docs/wasm.md): the example modules in examples/wasm/, built with
# clang and wasm-ld (C, no libc) and AssemblyScript (pinned by its package-lock.json) into
# examples/wasm/build/, where the runtime's tests load them. Each module is rebuilt only when
# its source or its SDK changed.
WASM_BUILD := examples/wasm/build
WASM_AS_SDK := sdk/wasm/assemblyscript
ASC := $(WASM_AS_SDK)/node_modules/.bin/asc
CLANG ?= clang
WASM_CFLAGS := --target=wasm32 -nostdlib -O2 -Wall -Wextra -Werror -Isdk/wasm/c \
	-Wl,--no-entry -Wl,--stack-first -Wl,--strip-all
WASM_MODULES := $(patsubst examples/wasm/%.c,$(WASM_BUILD)/%.wasm,$(wildcard examples/wasm/*.c)) \
	$(patsubst examples/wasm/%.ts,$(WASM_BUILD)/%_as.wasm,$(wildcard examples/wasm/*.ts)) \
	$(WASM_BUILD)/sdk_echo.wasm $(WASM_BUILD)/sdk_echo_as.wasm

# Modules that break rules on purpose, for the tests of the server's limits.
WASM_FIXTURES := $(patsubst tests/fixtures/wasm/%.c,tests/fixtures/wasm/build/%.wasm,$(wildcard tests/fixtures/wasm/*.c))

wasm: $(WASM_MODULES) $(WASM_FIXTURES)

tests/fixtures/wasm/build/%.wasm: tests/fixtures/wasm/%.c sdk/wasm/c/spindle.h | $(WASM_BUILD)/.clang
	@mkdir -p $(@D)
	$(CLANG) $(WASM_CFLAGS) -o $@ $<

$(WASM_BUILD)/%.wasm: examples/wasm/%.c sdk/wasm/c/spindle.h | $(WASM_BUILD)/.clang
	$(CLANG) $(WASM_CFLAGS) -o $@ $<

$(WASM_BUILD)/%_as.wasm: examples/wasm/%.ts $(WASM_AS_SDK)/assembly/index.ts $(ASC)
	@mkdir -p $(WASM_BUILD)
	$(ASC) $< --runtime stub --use abort=$(WASM_AS_SDK)/assembly/index/spindleAbort -O3 -o $@

# The SDKs' own checks (sdk/wasm/tests/), loaded by the runtime's tests beside the examples.
$(WASM_BUILD)/sdk_%.wasm: sdk/wasm/tests/%.c sdk/wasm/c/spindle.h | $(WASM_BUILD)/.clang
	$(CLANG) $(WASM_CFLAGS) -o $@ $<

$(WASM_BUILD)/sdk_%_as.wasm: sdk/wasm/tests/%.ts $(WASM_AS_SDK)/assembly/index.ts $(ASC)
	@mkdir -p $(WASM_BUILD)
	$(ASC) $< --runtime stub --use abort=$(WASM_AS_SDK)/assembly/index/spindleAbort -O3 -o $@

$(WASM_BUILD)/.clang:
	@{ command -v $(CLANG) && command -v wasm-ld; } >/dev/null || { apt-get update -qq && apt-get install -y -qq clang lld; } >/dev/null
	@{ command -v $(CLANG) && command -v wasm-ld; } >/dev/null || { echo "error: clang and wasm-ld (lld) could not be installed; the WebAssembly examples need them" >&2; exit 1; }
	@mkdir -p $(WASM_BUILD) && touch $@

$(ASC): $(WASM_AS_SDK)/package.json $(WASM_AS_SDK)/package-lock.json
	@command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm; } >/dev/null
	@command -v npm >/dev/null || { echo "error: npm could not be installed; the AssemblyScript examples need it" >&2; exit 1; }
	cd $(WASM_AS_SDK) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# k-means on generated data (the issue's size: 500,000 points x 50 dims, k = 25) on cloud threads.
demo: setup
	$(VENV)/bin/spindle run examples/kmeans.py --points 500000 --dims 50 -k 25 --threads 2 --iterations 10

test: setup pypy test-tools lint test-rust test-python

# What the tests need beyond the build: the Porcupine linearizability checker (Go; built once
# here, so no test fetches a module), iproute2 for the network-partition tests' namespaces, and
# the previous release's binary for the rolling upgrade test (built from history, minutes once).
CHECKER := target/linearizability
test-tools: $(CHECKER)
	$(PY) tests/previous_release.py
	@command -v ip >/dev/null || { apt-get update -qq && apt-get install -y -qq iproute2; } >/dev/null
	@command -v ip >/dev/null || { echo "error: iproute2 (ip) could not be installed; the partition tests need it" >&2; exit 1; }

$(CHECKER): tests/linearizability/main.go tests/linearizability/go.mod tests/linearizability/go.sum
	@command -v go >/dev/null || { apt-get update -qq && apt-get install -y -qq golang-go; } >/dev/null
	@command -v go >/dev/null || { echo "error: Go could not be installed; the linearizability checker needs it" >&2; exit 1; }
	cd tests/linearizability && go build -o ../../$(CHECKER) .

# Object hosts on PyPy (`spindle server --host-python .venv-pypy/bin/python`): Debian's pypy3
# and a virtual environment with the SDK, built aside and moved in place whole. Where that
# cannot be done (no root, no Debian, offline), the tests of such hosts say so and skip, and
# under CI (CI=true), where a skip fails the run, this step fails first.
PYPY_VENV := .venv-pypy
pypy:
	@command -v pypy3 >/dev/null || { apt-get update -qq && apt-get install -y -qq pypy3; } >/dev/null || true
	@if [ ! -f $(PYPY_VENV)/.installed -o requirements-pypy.lock -nt $(PYPY_VENV)/.installed ]; then \
		rm -rf $(PYPY_VENV).tmp; \
		{ command -v pypy3 >/dev/null \
		  && pypy3 -m venv $(PYPY_VENV).tmp \
		  && $(PYPY_VENV).tmp/bin/pip install --quiet --disable-pip-version-check -r requirements-pypy.lock \
		  && $(PYPY_VENV).tmp/bin/pip install --quiet --disable-pip-version-check --no-deps -e python \
		  && touch $(PYPY_VENV).tmp/.installed \
		  && rm -rf $(PYPY_VENV) && mv $(PYPY_VENV).tmp $(PYPY_VENV); } \
		|| { rm -rf $(PYPY_VENV).tmp; echo "warning: no PyPy environment (pypy3 3.9+ could not be installed or set up): the tests of PyPy object hosts will be skipped" >&2; \
		     case "$$CI" in true|1|yes) echo "error: CI needs the PyPy environment" >&2; exit 1;; esac; }; \
	fi

# Breaks the product and the harness on purpose, one way at a time, and checks that the tests
# catch each (docs/testing.md).
sabotage: setup test-tools
	tests/sabotage/run.sh

test-rust:
	$(CARGO) test --release --locked --workspace -- --include-ignored

# The run records what it collected and ran: a run cut short by a process exit fails here.
RUN_RECORD := target/pytest-run.json
test-python:
	rm -f $(RUN_RECORD)
	SPINDLE_TEST_RECORD=$(RUN_RECORD) $(PY) -m pytest tests
	$(PY) tests/ran_all.py $(RUN_RECORD)

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --locked --workspace --all-targets -- -D warnings

# Benchmarks run beside the real peers: redis-server (with TLS: bench/tls.py; behind webdis: bench/http_front.py), zookeeper and GNU parallel from Debian's packages (and pypy3,
# whose JIT bench/shared.py times on the Python method's loop); Ray,
# Lithops, PySpark (Java 17) and kazoo from requirements-bench.lock, in their own virtual environment so that they
# never enter the product's. `make bench QUICK=1` is a smoke check (small sizes, report in target/bench-quick/).
BENCH_VENV := .venv-bench
BPY := $(BENCH_VENV)/bin/python
BENCHES := objects latency throughput shared sync functions scaling ml santa durability shell cluster tls auth limits http_front
export QUICK

$(BENCH_VENV)/.installed: requirements.lock requirements-bench.lock python/pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.lock -r requirements-bench.lock
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e python
	touch $@

bench: setup pypy $(BENCH_VENV)/.installed
	command -v redis-server >/dev/null && command -v webdis >/dev/null && command -v parallel >/dev/null && test -f /usr/share/java/zookeeper.jar && command -v java >/dev/null && command -v pypy3 >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq redis-server webdis parallel zookeeper pypy3; }
	$(CARGO) build --release --locked -p spindle-loadgen
	install -m 755 target/release/spindle $(BENCH_VENV)/bin/spindle
	$(BPY) bench/summary.py --reset
	set -e; start=$$(date +%s); for b in $(BENCHES); do SECONDS=0; $(BPY) bench/$$b.py; \
		echo "bench/$$b.py: $${SECONDS} s" >&2; done; echo "all benchmarks: $$(( $$(date +%s) - start )) s" >&2
	$(BPY) bench/summary.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) target $(WASM_BUILD) $(WASM_AS_SDK)/node_modules
