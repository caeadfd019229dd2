# The two set-up commands of the README. Both create the virtual environment on first use.
VENV := .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0   # first and pinned: the CPU wheel, not a multi-GB CUDA build
	$(PY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: quickstart test
quickstart: $(VENV)/.installed
	$(VENV)/bin/ablate base-model --out models/tiny-arith
	$(VENV)/bin/ablate train configs/quickstart.yaml --out runs/quickstart

test: $(VENV)/.installed
	$(PY) -m pytest -q
