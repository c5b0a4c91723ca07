# The backlog syphon: `make help` lists the targets. `make run` and `make test` each set up
# what they need (virtualenv, pinned packages, Delta JARs) on a fresh clone. The library is
# lib/backlog_syphon (the wheel); tools/ (backlog writer, `make run`, test helpers) runs from the
# repository root and is not in the wheel.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JARS_STAMP := .cache/jars/.fetched
EMULATOR_CONFIG ?= conf/emulator.yaml
RUN_DIR := var/run
export PYTHONPATH := $(CURDIR)/lib
# Spark's Python workers must use the virtualenv's interpreter too.
export PYSPARK_PYTHON := $(CURDIR)/$(PY)
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(PY)

.DEFAULT_GOAL := help
.PHONY: help setup test test-unit test-runtimes run emulator bench bench-emulator soak lint dist clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-16s %s\n", $$1, $$2}'

# The emulator (emulator/) is its own distribution, installed editable as a dev dependency.
$(STAMP): requirements.lock setup.cfg emulator/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip install --quiet --no-deps -e emulator
	touch $@

$(JARS_STAMP): $(STAMP)
	$(PY) -m backlog_syphon.local_setup.delta_jars
	touch $@

# The class archive of Spark's JVM (lib/backlog_syphon/local_setup/class_archive.py): checked at every set-up
# (its name follows the installed Java and JARs), built once when missing; a failure only costs speed.
CLASS_ARCHIVE = $(1) -m backlog_syphon.local_setup.class_archive >/dev/null || echo "local Spark JVMs start without a class archive"

setup: $(STAMP) $(JARS_STAMP) ## Create the virtualenv, install pinned packages, fetch Delta's JARs, build the JVM's class archive
	@$(call CLASS_ARCHIVE,$(PY))

# The suite on TEST_WORKERS processes (pytest-xdist): three of them run the tests that need Spark, each
# on its own Spark session, in lanes of about equal measured seconds (tests/conftest.py); on two cores,
# one lane's waits on brokers, leases and triggers are the others' CPU, and a fourth Spark JVM only slowed
# each test down. The emulator's tests and the pure unit tests, which mostly wait on sockets and timers,
# run on the other two workers (and on a lane's once it is done). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 5
test: setup ## Run the whole test suite (unit, emulator/tests, Spark/Delta integration)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

test-unit: setup ## Run only the fast unit tests
	$(PY) -m pytest tests/unit

# The other Spark lines the job supports (docs/running/compute.md, "Supported runtimes"): each gets its own
# virtualenv .venv-spark<X.Y> from requirements-spark<X.Y>.lock (set up again only when that file
# changes) and its Delta JARs in .cache/jars (one folder per artifact and version), then runs
# tests/runtimes with its own interpreter. The virtualenvs are set up side by side (Maven then fetches
# one line's JARs after the other's), and the lines' tests run side by side too: their end-to-end runs
# mostly wait on jobs starting, brokers and triggers. Each line's output goes to
# .cache/test-runtimes/<X.Y>.log, printed once both are done. No class archive is built for them: on a fresh
# clone its build (about a minute per line) costs more than the few JVMs a scenario starts would gain.
# `make test-runtimes RUNTIMES=4.1` runs one of them.
RUNTIMES ?= 4.0 4.1
RUNTIME_VENVS := $(foreach r,$(RUNTIMES),.venv-spark$(r)/.installed)
RUNTIME_JARS := $(foreach r,$(RUNTIMES),.cache/jars/.fetched-spark$(r))

.venv-spark%/.installed: requirements-spark%.lock setup.cfg emulator/pyproject.toml
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(@D)/bin/python -m pip install --quiet --upgrade pip
	$(@D)/bin/python -m pip install --quiet -r $<
	$(@D)/bin/python -m pip install --quiet --no-deps -e . -e emulator
	touch $@

.cache/jars/.fetched-spark%: .venv-spark%/.installed
	.venv-spark$*/bin/python -m backlog_syphon.local_setup.delta_jars
	touch $@

test-runtimes: ## Run the end-to-end runtime scenario on each other Spark line (4.0, 4.1), each in its venv, side by side
	@$(MAKE) --no-print-directory -j $(words $(RUNTIMES)) $(RUNTIME_VENVS)
	@$(MAKE) --no-print-directory $(RUNTIME_JARS)
	@mkdir -p .cache/test-runtimes; for r in $(RUNTIMES); do \
	  py="$(CURDIR)/.venv-spark$$r/bin/python"; \
	  { PYSPARK_PYTHON="$$py" PYSPARK_DRIVER_PYTHON="$$py" "$$py" -m pytest tests/runtimes -p no:cacheprovider \
	      > .cache/test-runtimes/$$r.log 2>&1; echo $$? > .cache/test-runtimes/$$r.rc; } & \
	done; wait; failed=""; for r in $(RUNTIMES); do \
	  echo "== Spark $$r: $(CURDIR)/.venv-spark$$r/bin/python"; cat .cache/test-runtimes/$$r.log; \
	  [ "$$(cat .cache/test-runtimes/$$r.rc)" = 0 ] || failed="$$failed $$r"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-runtimes failed on Spark:$$failed"; exit 1; fi

# TRANSPORT=amqp-websockets: the syphon over AMQP over WebSockets (TLS) through an HTTP proxy, as a firewalled
# workspace reaches Azure on 443; TRANSPORT=amqps: over TLS (5671). The default: the emulators' plain AMQP.
# SCENARIO=migration: the migration mode, a Standard -> Premium migration's leftovers drained on the emulator
# (conf/emulator-migration.yaml, conf/local-migration.yaml).
TRANSPORT ?= amqp
SCENARIO ?= backlog
run: setup ## Start the local emulator, write a backlog, run the syphon, check and print what moved (TRANSPORT=amqp-websockets: through a proxy; SCENARIO=migration: the migration mode)
	$(PY) -m tools.local_run --emulator-config $(EMULATOR_CONFIG) --config conf/local.yaml --transport $(TRANSPORT) --scenario $(SCENARIO)

emulator: setup ## Run the local Service Bus emulator in the foreground (Ctrl-C stops it)
	$(PY) -m servicebus_emulator --config $(EMULATOR_CONFIG)

# BENCH_ARGS=--quick: a smoke run of a few minutes; `$(PY) bench/bench_syphon.py --help` lists the rest.
BENCH_ARGS ?=
bench: setup ## Benchmarks: the AMQP codec, then the syphon at a failover's latencies against plain SDK loops (~1 h)
	$(PY) bench/bench_codec.py
	$(PY) bench/bench_syphon.py $(BENCH_ARGS)

bench-emulator: setup ## The emulator's ceiling with the SDK alone, at 0, 5 and 20 ms per round trip
	$(PY) bench/bench_emulator.py --latency-ms 0 5 20

# SOAK_ARGS="--batches 40": a short run of a few minutes; `$(PY) bench/soak.py --help` lists the rest.
SOAK_ARGS ?=
soak: setup ## The continuous syphon under a trickle for 2,000 batches (~80 min): per-tenth costs, memory, table files
	$(PY) bench/soak.py $(SOAK_ARGS)

lint: setup ## Byte-compile everything and look for unused names and other obvious mistakes
	$(PY) -m compileall -q lib jobs tests bench emulator/src emulator/tests tools
	$(PY) -m pyflakes lib jobs tests bench emulator/src emulator/tests tools

dist: setup ## Build the wheel (Databricks) and a zip of lib/ (spark-submit --py-files) into dist/
	rm -rf build  # setuptools reuses it: an earlier build's modules, since removed, would ship again
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .
	cd lib && $(CURDIR)/$(PY) -c "import pathlib, zipfile; \
	  z = zipfile.ZipFile('../dist/backlog_syphon_libs.zip', 'w', zipfile.ZIP_DEFLATED); \
	  [z.write(p) for p in sorted(pathlib.Path('backlog_syphon').rglob('*.py'))]; z.close()"
	@ls -1 dist

clean: ## Remove the virtualenvs, caches, build output and local run state
	rm -rf $(VENV) .venv-spark* .cache build dist var lib/*.egg-info emulator/src/*.egg-info emulator/build .pytest_cache spark-warehouse metastore_db derby.log
