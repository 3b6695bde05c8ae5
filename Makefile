# Neuron Explorer task runner. `make help` lists the targets.
PY      := .venv/bin/python
STAMP   := .venv/.installed
PORT    ?= 8765

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

venv: $(STAMP) ## create .venv with the pinned requirements and the project in editable mode

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

browser: ## install Debian's chromium for the browser tests (needs root)
	@test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium)

demo: venv ## set up, capture the GPT sample on the neuron device, analyze it and serve the UI
	rm -rf profiles/gpt_train
	.venv/bin/neuron-explorer capture -o profiles/gpt_train -- python samples/gpt_train.py
	.venv/bin/neuron-explorer summary profiles/gpt_train
	.venv/bin/neuron-explorer analyze profiles/gpt_train
	.venv/bin/neuron-explorer serve profiles --port $(PORT)

lint: venv ## ruff check, ruff format check and mypy
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: venv browser lint ## set up and run the whole test suite (and name its slowest tests)
	$(PY) -m pytest -q --durations=15

test-fast: venv ## the suite without the slow tests (seconds-long captures) and the browser
	$(PY) -m pytest -q -m 'not slow and not sweep and not browser'

test-sweep: venv java .venv/.sweep ## only the whole sweeps (op_db, the zoo, 4 ranks, Spark)
	$(PY) -m pytest -q -m sweep --durations=15

.venv/.sweep: requirements-sweep.txt $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-sweep.txt
	touch .venv/.sweep

java: ## install Debian's Java for the Spark tests (needs root)
	@test -x /usr/bin/java || (apt-get update -q && apt-get install -y -q default-jre-headless)

wheel-smoke: venv ## build the wheel, install it in a fresh venv outside the checkout, try it
	.ci/wheel-smoke

bench: venv ## run the benchmarks (slow; results go in benchmarks/README.md)
	$(PY) benchmarks/run_all.py

fidelity: venv ## the cost model against published Trainium measurements (docs/costmodel.md)
	$(PY) benchmarks/fidelity.py

clean: ## remove caches and generated profiles
	rm -rf profiles .pytest_cache .ruff_cache .mypy_cache

.PHONY: help venv browser java demo lint test test-fast test-sweep wheel-smoke bench fidelity clean
