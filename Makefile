# The README's two commands: `make demo` (open the console on the demo lab) and `make test`.
# Both create .venv on first use; torch's CPU build goes in first so that transformers and
# peft do not pull CUDA packages.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs bench screenshots clean llama-server fleet-browser

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[train,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cetlab-console --demo

# ruff and mypy first (agents, console and widgets at zero errors, [tool.mypy] in pyproject), then both tiers of the
# suite on every core (pytest-xdist; each worker its own ports, folders and demo labs)
# three workers on two cores: most tests wait on processes (agents, trainers, engines), not on the CPU
PYTEST_WORKERS ?= 3
test: $(STAMP) llama-server
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --durations=30  # the long poles, printed for the suite-time work

# The edit loop's tier, tests/fast/: no process started (agents in the test's own event loop, tests/support/inprocess.py);
# the end-to-end tier, tests/e2e/ (real SSH, agent processes, trainers, sshd, llama-server), is marked e2e by its folder
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not e2e"

# The manual (docs/, mkdocs.yml): the generated reference pages checked against the code, then built into site/
docs: $(STAMP)
	$(BIN)/python docs/gen.py --check
	$(BIN)/mkdocs build --strict

# The pinned llama-server (llama.cpp from llama-cpp-python's sdist), built once into ~/.cache/cetlab/;
# on a GPU box: make llama-server LLAMA_CUDA_ARCHS="61;70;86" (needs nvcc)
llama-server: $(STAMP)
	$(BIN)/python -m agents.orchestra.engines.llamacpp.build $(if $(LLAMA_CUDA_ARCHS),--cuda --cuda-archs "$(LLAMA_CUDA_ARCHS)")

# The benches start cetlab's commands (cetlab-train, cetlab-agent): the venv's, first on PATH.
# Ends with a table of goals met and missed; exits 1 when a goal was missed, 2 when a bench failed.
bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run_all.py

screenshots: $(STAMP)
	$(BIN)/python screenshots/make_screenshots.py

# The served console in headless Chromium (docs/console.md): screenshots/fleet-browser.png
fleet-browser: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bench/fleet_browser_screenshot.sh

clean:
	rm -rf $(VENV) .pytest_cache site
