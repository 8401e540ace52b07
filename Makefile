# Everything a fresh machine needs: `make demo` (index the sample corpus, then query it) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_HOME ?= .corpusync-demo
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# demo, gate, test and bench embed with the packaged MiniLM (the default embedder, bge-m3, needs its weights)
export CORPUSYNC_EMBEDDER ?= minilm

.PHONY: install demo gate test lint typecheck bench clean

install: $(STAMP)

# scripts/install.sh, the Docker image's install too: torch first and pinned, the CPU build from PyTorch's
# CPU index on a machine without a GPU (the default index's, with a message, when that index cannot be
# reached; TORCH=cuda for the CUDA build), then everything else under the verified constraints, through uv
# (INSTALLER=pip, or CORPUSYNC_INSTALLER=pip, where only a pip mirror is reachable: uv does not read pip's
# configuration; install.sh reads the variable and defaults to uv).
TORCH ?= auto
$(STAMP): pyproject.toml requirements/constraints.txt scripts/install.sh
	$(PYTHON) -m venv $(VENV)
	bash scripts/install.sh --python $(BIN)/python --extras eval,dev --torch $(TORCH) $(if $(INSTALLER),--installer $(INSTALLER))
	touch $(STAMP)

demo: install
	CORPUSYNC_GOLDSETS='["examples/goldset.jsonl"]' $(BIN)/corpusync --home $(DEMO_HOME) refresh examples/sample-corpus
	$(BIN)/corpusync --home $(DEMO_HOME) query "合同编号 HT2023-0876 的付款方式是什么？" -k 3
	$(BIN)/corpusync --home $(DEMO_HOME) query "Which team won Super Bowl 50?" -k 3
	$(BIN)/corpusync --home $(DEMO_HOME) query "扫除肌肤代谢物的最佳“清道夫”是什么养分？" -k 3
	$(BIN)/corpusync --home $(DEMO_HOME) db status

# The CI gate (.github/workflows/corpus-gate.yml) locally: index the corpus as it is at $(BASE), then
# refresh to the working tree's corpus; the refresh is evaluated on the gold set and refused (exit 1)
# if retrieval regressed.
BASE ?= HEAD
GATE_HOME ?= .corpusync-gate
GATE_BASE := $(GATE_HOME)/base-checkout
gate: install
	-$(BIN)/corpusync --home $(GATE_HOME) model stop
	rm -rf $(GATE_HOME) && mkdir -p $(GATE_HOME)
	git archive --format=tar --prefix=base-checkout/ $(BASE) examples/sample-corpus | tar -x -C $(GATE_HOME)
	CORPUSYNC_GOLDSETS='["examples/goldset.jsonl"]' $(BIN)/corpusync --home $(GATE_HOME) refresh -q $(GATE_BASE)/examples/sample-corpus
	CORPUSYNC_GOLDSETS='["examples/goldset.jsonl"]' $(BIN)/corpusync --home $(GATE_HOME) refresh examples/sample-corpus

# Three pytest workers on 2 cores, a whole test file on each (module fixtures are built once): much of a test
# waits on processes, servers, downloads and locks, not on the CPU. On the same code here: 1,252 s with 3 workers,
# 1,463 s with 2. TEST_WORKERS=0 runs the suite serially. --durations lists the slowest tests, so a slow CI run
# shows where its time went.
TEST_WORKERS ?= 3
test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/refresh.py

clean:
	-$(BIN)/corpusync --home $(DEMO_HOME) model stop
	-$(BIN)/corpusync --home $(DEMO_HOME) db stop
	-$(BIN)/corpusync api stop
	rm -rf $(DEMO_HOME)
