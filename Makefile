# Two commands do everything on a fresh machine (see README):
#   make report   set up .venv, prepare the embedded pair, run the notebooks, render reports/
#   make test     set up .venv, run the unit + real-model tests and the notebooks (nbval)
# GPU=1 selects the CUDA environment (requirements/gpu-*.txt) instead of the CPU one.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
ifeq ($(GPU),1)
  REQ := gpu
else
  REQ := cpu
endif
# torch 2.13.0+cpu lives on the PyTorch CPU index; a machine that already has the wheel (this
# workplace's /opt/wheels) needs no extra index.
TORCH_INDEX ?= $(if $(wildcard /opt/wheels/torch-2.13.0+cpu*),,--extra-index-url https://download.pytorch.org/whl/cpu)
STAMP  := $(VENV)/.installed-$(REQ)

.PHONY: venv prepare test test-fast report clean-reports distill-cpu

venv: $(STAMP)

$(STAMP): requirements/$(REQ)-deps.txt requirements/$(REQ)-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel
	$(PIP) install -q $(if $(filter cpu,$(REQ)),$(TORCH_INDEX)) -r requirements/$(REQ)-deps.txt
	$(PIP) install -q --no-deps -r requirements/$(REQ)-nodeps.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) -m sdeth.envcheck $(REQ)
	rm -f $(VENV)/.installed-*
	touch $@

prepare: venv
	$(PY) -m sdeth prepare

test: venv
	$(PY) -m pytest -q tests
	SDETH_REPORTS=$(VENV)/test-reports $(PY) -m pytest -q --nbval-lax notebooks

test-fast: venv
	$(PY) -m pytest -q -m "not slow" tests

report: prepare
	$(PY) -m sdeth.study.report

distill-cpu: venv
	$(PY) -m sdeth.models.distill --out $(VENV)/draft-cpu --layers 6 --prompts 320 --gen-tokens 96 --train-minutes 8
