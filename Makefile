# Two commands do everything from a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MEGATRON_LM ?= $(VENV)/megatron-lm

.PHONY: demo test lint bench figures clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "pipebubble needs Python >= 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,hf,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) code/main.py

# Everything, as CI runs it, one pytest worker per core (pytest-xdist; each test file stays
# on one worker, in order); the 10 slowest tests are listed so a slow one is noticed.
# Quick local loop: $(PY) -m pytest -m "not slow and not distributed"
WORKERS ?= auto
test: $(STAMP) $(MEGATRON_LM)
	$(VENV)/bin/ruff check .
	MEGATRON_LM=$(MEGATRON_LM) $(PY) -m pytest -n $(WORKERS) --dist loadfile --durations=10

# Megatron-LM's argument parser (megatron/training; megatron-core's wheel has megatron.core
# only) at the tag of the megatron-core the test extra pins, for tests/test_paste_megatron.py.
# Offline, the clone fails and those tests skip, saying why.
$(MEGATRON_LM):
	-git clone -q --depth 1 --branch core_v0.16.1 --filter=blob:none --sparse \
		https://github.com/NVIDIA/Megatron-LM $(MEGATRON_LM) && git -C $(MEGATRON_LM) \
		sparse-checkout set megatron/training megatron/legacy megatron/post_training megatron/rl

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

figures: $(STAMP)
	$(PY) examples/make_figures.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
