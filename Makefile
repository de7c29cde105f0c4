# Everything a newcomer needs: `make demo` runs the main job, `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast demo bench chaos lint schemas model clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

# Most tests wait on peers (sshd, the emulators, git, PostgreSQL), not on the CPU: four
# pytest-xdist workers keep two cores busy and halve the wall time. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 4
test: $(STAMP)
	bash scripts/test-services.sh
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# Unit tests and the SQLite contract tests: no server, under a minute (tests/README.md).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "(unit or (contract and sqlite)) and not slow"

# The property-based model tests, many more and longer sequences than CI's: the reconciler
# under faults (tests/reconciler/test_model.py) and sharing under any order of events
# (tests/admission/test_model.py); a few minutes. MODEL_EXAMPLES / MODEL_STEPS override.
MODEL_EXAMPLES ?= 500
MODEL_STEPS ?= 40
model: $(STAMP)
	MODEL_EXAMPLES=$(MODEL_EXAMPLES) MODEL_STEPS=$(MODEL_STEPS) $(BIN)/python -m pytest -q -p no:logging \
		tests/reconciler/test_model.py tests/admission/test_model.py --hypothesis-show-statistics

demo: $(STAMP)
	$(BIN)/ledger demo

bench: $(STAMP)
	$(BIN)/python bench/ledger_bench.py

# The chaos harness, long: the real watcher and reconcilers under kill -9, preemptions, host
# kills, capacity drops and failed operations, for CHAOS_DURATION seconds on each store (one
# reconciler on SQLite, two sharing leases on PostgreSQL); exits 1 if an invariant broke.
CHAOS_DURATION ?= 600
CHAOS_SEED     ?= 1
CHAOS_JOBS     ?= 6
chaos: $(STAMP)
	$(BIN)/ledger chaos --store sqlite --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) --jobs $(CHAOS_JOBS); a=$$?; \
	$(BIN)/ledger chaos --store postgres --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) --jobs $(CHAOS_JOBS); b=$$?; \
	test $$a = 0 && test $$b = 0

# The event schema is generated from the classes in ledger/events/ (never edited by hand).
schemas: $(STAMP)
	$(BIN)/python scripts/event_schema.py

# ruff, and the layers as import contracts (.importlinter; docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
