# Two commands matter: `make demo` (the main job) and `make test` (the suite).
# Both install into .venv first. torch is pinned to the CPU build that this
# machine serves locally; an unpinned torch would pull several GB of CUDA.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
# Extra package index for torch (`make install-gpu` sets PyTorch's CUDA index).
TORCH_INDEX ?=
# The CUDA build `make install-gpu` asks PyTorch's index for (cu126, cu128, cu130, ...).
CUDA_TAG ?= cu128
STAMP := $(VENV)/.installed
# Lightning 1.x beside the venv's 2.x, for tests/test_lightning_v1.py only (1.8.6: the last
# release with 1.x's pytorch_lightning.core.lightning module path).
PTL1 := .venv-ptl1
PTL1_SPEC ?= pytorch_lightning==1.8.6
PTL1_STAMP := $(PTL1)/.installed
# pip compiles what it installs on one core; compileall uses all of them (half the wall time
# here). Like pip, it goes on past files it cannot compile (torch ships a 3.12-only one).
COMPILE := $(PY) -m compileall -qq -j 0
# The repository's own modules, compiled before each suite: where PYTHONDONTWRITEBYTECODE is
# set (as on this machine), each of the suite's hundreds of processes would otherwise
# compile them again (0.1 s each). A stale .pyc is never used: Python checks the source.
OWN_CODE := raysgd tests bench examples operators

.PHONY: install install-gpu demo test test-fast bench bench-quick bench-gpu bench-disk bench-warm bench-data bench-fsdp bench-chaos bench-tax docs clean

install: $(STAMP) $(PTL1_STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) \
		"$(TORCH_SPEC)" -e ".[test]"
	$(COMPILE) $(VENV)/lib || true
	touch $(STAMP)

# No dependencies: the venv's torch, torchmetrics, lightning-utilities and fsspec serve 1.8.6;
# setuptools<81 brings back the pkg_resources its namespace packages import.
$(PTL1_STAMP): | $(STAMP)
	rm -rf $(PTL1)
	$(PY) -m pip install -q --target $(PTL1) --no-deps "$(PTL1_SPEC)" "setuptools<81"
	touch $(PTL1_STAMP)

# On a GPU machine of your own: the same venv with torch's CUDA build (a reinstall), so
# `make test` runs tests/test_gpu.py too. The lent GPU machine reaches no package index:
# tools/gpu_check.sh uses the torch of its image instead.
install-gpu:
	rm -f $(STAMP)
	$(MAKE) install TORCH_SPEC="torch==2.13.0+$(CUDA_TAG)" \
		TORCH_INDEX=https://download.pytorch.org/whl/$(CUDA_TAG)

demo: install
	$(PY) examples/digits_demo.py

test: install
	$(COMPILE) $(OWN_CODE)
	$(PY) -m pytest -q tests

test-fast: install
	$(COMPILE) $(OWN_CODE)
	$(PY) -m pytest -q -m "not slow" tests


# The documentation site, from docs/ and the docstrings, into site/ (git ignores it).
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build

clean:
	rm -rf $(VENV) $(PTL1) *.egg-info .pytest_cache site

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

bench-fsdp: install
	$(PY) -m bench.fsdp

bench-chaos: install
	$(PY) -m bench.chaos

bench-tax: install
	$(PY) -m bench.tax
