# The README's two commands: `make demo` (open the console on the demo lab) and `make test`.
# Both create .venv on first use; torch's CPU build goes in first so that transformers and
# peft do not pull CUDA packages.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cetlab-console --demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The benches start cetlab's commands (cetlab-train, cetlab-agent): the venv's, first on PATH.
# Ends with a table of goals met and missed; exits 1 when a goal was missed, 2 when a bench failed.
bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run_all.py

screenshots: $(STAMP)
	$(BIN)/python screenshots/make_screenshots.py

clean:
	rm -rf $(VENV) .pytest_cache
