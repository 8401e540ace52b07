# Everything a fresh machine needs: `make demo` (index the sample corpus, then query it) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_HOME ?= .corpusync-demo
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install demo test lint typecheck bench clean

install: $(STAMP)

# torch first and pinned (CPU build), or a dependency pulls a multi-GB CUDA build; then everything else
# under the verified constraints (../shared/STACK.md).
$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements/constraints.txt torch
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e ".[eval,dev]"
	touch $(STAMP)

demo: install
	$(BIN)/corpusync --home $(DEMO_HOME) refresh examples/sample-corpus
	$(BIN)/corpusync --home $(DEMO_HOME) query "合同编号 HT2023-0876 的付款方式是什么？" -k 3
	$(BIN)/corpusync --home $(DEMO_HOME) query "Which team won Super Bowl 50?" -k 3
	$(BIN)/corpusync --home $(DEMO_HOME) db status

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/refresh.py

clean:
	-$(BIN)/corpusync --home $(DEMO_HOME) db stop
	rm -rf $(DEMO_HOME)
