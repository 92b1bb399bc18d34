# Two commands matter: `make demo` and `make test` (`make test-all` runs every test, as CI does).
# Each creates or reuses .venv and installs what is missing. A CPU-only machine gets torch==2.13.0;
# a machine whose system Python already has a CUDA build of torch keeps it (the venv then sees the
# system site-packages).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mimo-installed

.PHONY: demo test test-all lint install clean

$(STAMP): pyproject.toml
	@if [ ! -x $(PY) ]; then \
	  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	    python3 -m venv --system-site-packages $(VENV); \
	  else \
	    python3 -m venv $(VENV); \
	  fi; \
	fi
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,hf]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mimo train configs/demo_vlm.toml --run.overwrite=true

# test: every test outside tests/distributed/ and one multi-process test per family (tests/conftest.py CORE)
test: $(STAMP)
	$(PY) -m pytest -q -x --durations=15 -m "not distributed or core"

test-all: $(STAMP)
	$(PY) -m pytest -q -x --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache
