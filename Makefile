# make demo  — set everything up and run examples/classify-tickets.yaml on the embedded model
# make test  — set everything up (with test extras) and run the whole test suite
#
# The embedded model runs on llama-cpp-python, built here from source with explicit flags
# (the default native build crashes on CPUs with AMX): AVX2, plus AVX-512 with VNNI, VBMI
# and BF16 when this machine's CPU has all four (they double the int8 dot products the
# quantised model runs on: the local route's engine ran 1.2-1.4x more prompts/s). The wheel is
# built once per flag set into ~/.cache/lowtide/wheels and reused; pip's own cache is never
# used for it, so a wheel built with other flags (or for another CPU) cannot sneak back in.
# LLAVA_BUILD=OFF skips the multimodal library (libmtmd: 51 of the build's 178 objects; the
# wheel 23.8 -> 19.6 MB): lowtide runs text models only, and llama_cpp loads libmtmd only for
# its LLaVA chat handler.
# The first build takes about 5-8 minutes on 2 cores.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LLAMA_VERSION := 0.3.36
AVX512_CPU_FLAGS := avx512f avx512_vnni avx512vbmi avx512_bf16
HAS_AVX512 := $(shell for f in $(AVX512_CPU_FLAGS); do grep -qw $$f /proc/cpuinfo 2>/dev/null || exit 1; done && echo yes)
LLAMA_AVX512_ARGS := $(if $(HAS_AVX512),-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $(LLAMA_AVX512_ARGS) -DLLAVA_BUILD=OFF
LLAMA_KEY := $(shell printf '%s %s' '$(LLAMA_VERSION)' '$(LLAMA_CMAKE_ARGS)' | sha1sum | cut -c1-12)
WHEELS := $(HOME)/.cache/lowtide/wheels/llama-cpp-python-$(LLAMA_KEY)
LLAMA_STAMP := $(VENV)/.llama-$(LLAMA_KEY)
TEST_STAMP := $(VENV)/.test-extras

.PHONY: demo test install install-test bench lint clean

demo: install
	$(BIN)/lowtide run examples/classify-tickets.yaml
	$(BIN)/lowtide results classify-tickets --out examples/results/classify-tickets.csv --compare gold
	@echo "SmolLM2-135M-Instruct is a tiny demo-quality model, run here with no key and no network."
	@echo "Real work goes to a provider batch route (openai-batch, anthropic-batch) or a self-hosted server."

# Four workers on two cores: most tests wait on servers, subprocesses and databases, not the CPU;
# --dist loadfile keeps a module's tests (and its module-scoped servers) on one worker.
# The source is compiled again first (only what changed since; see install-test for why), and
# the 25 slowest tests are printed, so a CI log says where its time went.
test: install-test
	$(BIN)/python -m compileall -qq -j 0 src tests || true
	$(BIN)/python -m pytest -n 4 --dist loadfile --durations=25

bench: install
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/local.py
	$(BIN)/python bench/embed_local.py

lint: install-test
	$(BIN)/ruff check src tests bench
	$(PYTHON) ../shared/tools/layers.py . || $(BIN)/python ../shared/tools/layers.py .

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(LLAMA_STAMP): | $(BIN)/python
	@if ! ls $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1; then \
		echo "building llama-cpp-python $(LLAMA_VERSION) (once, ~5-8 min on 2 cores)"; \
		mkdir -p $(WHEELS).tmp && \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --no-cache-dir --no-deps \
			--wheel-dir $(WHEELS).tmp llama-cpp-python==$(LLAMA_VERSION) && \
		rm -rf $(WHEELS) && mv $(WHEELS).tmp $(WHEELS); \
	fi
	$(BIN)/pip install --quiet --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	touch $@

install: $(LLAMA_STAMP)
	$(BIN)/pip install --quiet -e ".[local,embed,pandas,postgres]"

# Byte-compiled here, explicitly: these machines set PYTHONDONTWRITEBYTECODE=1, so Python never
# writes a .pyc when it imports, and a module without one is compiled again by every process
# that imports it (`lowtide status --help`: 1.7 s of CPU without, 0.6 s with; the suite starts
# hundreds of `lowtide` processes). compileall on every core takes ~27 s for the packages and
# lowtide's own source, where pip's own compile goes one module after another (~70 s).
# A module that does not compile (a package's test data) is left to be compiled where imported.
# Done again when pyproject.toml changes (checking 28,000 compiled modules costs ~10 s of CPU).
install-test: $(TEST_STAMP)

$(TEST_STAMP): pyproject.toml $(LLAMA_STAMP)
	$(BIN)/pip install --quiet --no-compile -e ".[local,embed,test,airflow,dagster,otel,s3,gcs,openrouter,mistral,digitalocean,bedrock,vertex]"
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib src tests || true
	touch $@

clean:
	rm -rf $(VENV) lowtide.db lowtide.db-wal lowtide.db-shm examples/results
