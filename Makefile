# Two commands do all the set-up on a fresh machine with Python 3.11:
#   make run    the live system on this machine (hops up; Ctrl-C stops it)
#   make test   lint, type-check, the import contract and the whole test suite
#   make path   prints the line that puts hops on the PATH (eval it)
# Both install the exact versions of constraints.txt (the solver's among them:
# they move results; docs/results.md, "Reproducible results"). `make lock`
# rewrites that file from the versions installed in .venv.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench lock clean path

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hops up

# The line that puts .venv/bin (hops, python) first on the PATH of this shell:
#   eval "$(make -s path)"      (the same as: source .venv/bin/activate)
path:
	@echo 'export PATH="$(CURDIR)/$(BIN):$$PATH"'

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/plan_round.py

# The local label of a wheel (torch's "+cpu") is dropped: "torch==2.13.0" admits
# 2.13.0+cpu from a local index and 2.13.0 from PyPI alike.
lock: $(STAMP)
	{ echo '# Exact versions of every third-party distribution that `make` installs'; \
	  echo '# (pip install -c constraints.txt -e .[dev]). pyproject.toml keeps ranges;'; \
	  echo '# this file pins them so that a fresh install reproduces the numbers of'; \
	  echo '# docs/results.md: highspy and numpy move results (tests/test_pinned_summaries.py).'; \
	  echo '# Regenerate from .venv with `make lock` (after a deliberate upgrade there), then'; \
	  echo '# update tests/data/pinned-versions.json and rerun `make test`.'; \
	  $(BIN)/pip freeze --exclude-editable | grep -v -i -e '^#' -e '^hops-scheduler' | sed -E 's/\+[A-Za-z0-9.]+$$//'; \
	} > constraints.txt.new
	mv constraints.txt.new constraints.txt
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
