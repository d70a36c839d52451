# `make test` sets up a fresh machine (Debian packages, .venv, control-plane build) and runs the
# whole suite. Set HYPERTOPO_REQUIRE_REAL=1 (as .ci/run does) to fail instead of skip when a real
# component is missing.
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

.PHONY: test test-fast setup lint bench demo

setup:
	bash tests/setup.sh

test: setup
	$(VENV)/bin/python -m pytest -ra -p no:cacheprovider --durations=20

# `make demo`: the end-to-end fabric lab (tests/lab/fabric_lab.py) on this machine, after the same
# setup as `make test`: lldpd switches and hosts in network namespaces, a real API server, the three
# programs; it prints each step (the tree, a gang placed, a cut link, Ready=False, the pods moved).
# Needs root (network namespaces).
demo: setup
	$(VENV)/bin/python -u tests/lab/fabric_lab.py

# `make test-fast`: the unit tests only (tests/unit: in-process, no real parts), in under a minute;
# `make test` runs every kind: tests/{unit,live,fuzz,cli,lint} (see tests/README.md).
test-fast: $(VENV)/bin/python
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/unit

$(VENV)/bin/python:
	bash tests/setup.sh

lint:
	$(VENV)/bin/python -m ruff check agent aggregator tests
	$(VENV)/bin/python -m mypy
	$(VENV)/bin/lint-imports

bench: setup
	$(VENV)/bin/python tests/bench/bench_agent.py
	$(VENV)/bin/python tests/bench/bench_aggregator.py
	$(VENV)/bin/python tests/bench/bench_placement.py
	$(VENV)/bin/python tests/bench/bench_spares.py
	$(VENV)/bin/python tests/bench/bench_spares.py --live-decisions
	$(VENV)/bin/python tests/bench/bench_scheduler_events.py
	$(VENV)/bin/python tests/bench/bench_measure.py
	$(VENV)/bin/python tests/bench/bench_memory.py --inprocess 5000
	$(VENV)/bin/python tests/bench/bench_soak.py --nodes 5000 --minutes 10 --kill-leader-at 240 --rollout-at 420
