# Two commands matter: `make demo` (the main job) and `make test` (the suite).
# Both install into .venv first. torch is pinned to the CPU build that this
# machine serves locally; an unpinned torch would pull several GB of CUDA.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench bench-quick bench-gpu bench-disk bench-warm bench-data clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: install
	$(PY) examples/digits_demo.py

test: install
	$(PY) -m pytest -q tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests


clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

bench: install
	$(PY) -m bench

bench-quick: install
	$(PY) -m bench --quick

bench-gpu: install
	$(PY) -m bench.gpu

bench-disk: install
	$(PY) -m bench.disk

bench-warm: install
	$(PY) -m bench.warm

bench-data: install
	$(PY) -m bench.data
