# Two commands do everything from a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The test extra installs torchtitan's current line (0.3); its 0.2 line (the TOML job file) is a
# second oracle for the pastes, pure Python, kept in a folder of its own beside it and put on
# the path only for tests/test_paste_torchtitan.py (make test-heavy).
TITAN02     := $(VENV)/torchtitan-0.2
TITAN02_PIN := torchtitan==0.2.2

.PHONY: demo test test-heavy test-all lint bench figures clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "pipebubble needs Python >= 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,hf,test]'
	$(PY) -m pip install -q --no-deps --upgrade --target $(TITAN02) $(TITAN02_PIN)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) code/main.py

# Two tiers, one pytest worker per core (pytest-xdist; each test file stays on one worker, in
# order); the 20 slowest tests are listed so a slow one is noticed.
#   make test        ruff, then every test not marked slow or distributed (target 5 min, 2 cores)
#   make test-heavy  the tests marked slow or distributed: gloo launches, long searches,
#                    brute-force oracles, real model steps (about 8 minutes on 2 cores)
#   make test-all    both; CI (.ci/run) runs both
WORKERS ?= auto
PYTEST  := $(PY) -m pytest -n $(WORKERS) --dist loadfile --durations=20
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PYTEST) -m "not slow and not distributed"

test-heavy: $(STAMP)
	$(PYTEST) -m "slow or distributed"
	PYTHONPATH=$(TITAN02) $(PY) -m pytest -n 0 -m slow tests/test_paste_torchtitan.py

test-all: test test-heavy

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

figures: $(STAMP)
	$(PY) examples/make_figures.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
