# make run   : install what is needed and start ringlet's main job
# make test  : install what is needed and run lint plus the whole test suite (in parallel processes)
# make test-fast : the tests not marked `slow`, for the edit-test loop
# make lint  : ruff, pyright and import-linter
# make docs  : build the docs site into site/ (strict: any warning fails); make docs-serve serves it
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama.cpp (built by llama-cpp-python) crashes at the first token on these CPUs when built natively;
# build it portably. LLAVA_BUILD=OFF leaves out libmtmd (multimodal models, which ringlet never loads):
# 127 files to compile instead of 178. pip caches the wheel, so this costs a few minutes once per machine.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DLLAVA_BUILD=OFF
# The suite runs in WORKERS processes (pytest-xdist): most tests wait on sockets, subprocesses and PostgreSQL,
# so more processes than cores pay. Each has its own PostgreSQL server, ports and temporary folders;
# --dist load hands tests out one at a time, slow ones first, so the processes end together; the modules whose
# tests share a loaded model or a server keep them in one process (tests/scheduling.py).
WORKERS ?= 4
PYTEST := $(BIN)/pytest -n $(WORKERS) --dist load
PORT ?= 8000

.PHONY: run test test-fast lint bench docs docs-serve clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	# PyPI's torch (needed by the embeddings extra) pulls gigabytes of CUDA packages: install the CPU-only
	# wheel these machines keep in /opt/wheels first; without one, pip takes PyPI's torch.
	wheel=$$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -n 1); \
	  if [ -n "$$wheel" ]; then $(BIN)/pip install --quiet --find-links /opt/wheels "$$wheel"; fi
	# The reference MCP server the tests run, tsx for TypeScript tools, and the AG-UI, A2A and AI SDK (`ai`)
	# clients the conformance tests drive (npm); kept inside the venv, never fetched at test time. npm downloads
	# while pip installs (and compiles llama.cpp).
	npm install --no-audit --no-fund --silent --prefix $(VENV)/node @modelcontextprotocol/server-everything@2026.8.31 \
	  tsx@4.23.15 @ag-ui/client@1.0.0 @a2a-js/sdk@1.3.0 ai@7.0.173 & npm=$$!; \
	  $(BIN)/pip install --quiet -e '.[dev,embeddings]' || { wait $$npm; exit 1; }; \
	  wait $$npm
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

# Serve the agents (the built-in assistant included) on 127.0.0.1:8000 without API keys (loopback only).
# With no API key for a hosted model, the assistant runs on the embedded SmolLM2-135M model.
run: $(STAMP)
	$(BIN)/ringlet serve --host 127.0.0.1 --port $(PORT) --auth none

LINT := $(BIN)/ruff check src tests bench && $(BIN)/lint-imports && $(BIN)/pyright

lint: $(STAMP)
	$(LINT)

# The linters run beside the tests, their output kept until the tests end: pyright alone takes a minute of
# one core, which the tests' processes, waiting on I/O much of the time, leave free.
test: $(STAMP)
	log=$$(mktemp); ($(LINT)) >$$log 2>&1 & lint=$$!; \
	  $(PYTEST); tests=$$?; wait $$lint; linted=$$?; echo "--- lint: $(LINT)"; cat $$log; rm -f $$log; \
	  if [ $$linted -ne 0 ]; then echo "--- lint failed (above)"; fi; [ $$tests -eq 0 ] && [ $$linted -eq 0 ]

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

docs: $(STAMP)
	$(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

bench: $(STAMP)
	$(BIN)/python bench/loop_overhead.py
	$(BIN)/python bench/local_model.py
	$(BIN)/python bench/server_load.py
	$(BIN)/python bench/gates.py
	$(BIN)/python bench/inflight_memory.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/catalog.py
	$(BIN)/python bench/mcp_calls.py
	$(BIN)/python bench/evals.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
