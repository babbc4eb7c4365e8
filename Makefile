# tfbook: two commands do everything on a fresh machine.
#   make book   set up, then build the whole book (every chapter executed) into _build/html
#   make test   set up, then run every test (units, parity, nbval over chapters, browser)
# Also: make lab (JupyterLab with the chapters as notebooks), make serve (the built site on
# http://127.0.0.1:$(PORT)/), make bench (benchmarks).

SHELL := /bin/bash
PYTHON ?= python3.11
NPM ?= npm
VENV := .venv
BIN := $(VENV)/bin
PY_STAMP := $(VENV)/.tfbook-installed
JS_STAMP := node_modules/.tfbook-installed
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
PY_REQS := requirements.txt requirements-test.txt requirements-nodeps.txt constraints.txt pyproject.toml

.PHONY: setup book test lab bench serve clean check-tools check-chromium vendor

# On a loaded machine torch's OpenMP threads spin while they wait for work and can run 15-20x
# slower (a run here hung for 40 minutes): make them sleep instead, in the book build, the
# tests, the kernels they start and the benchmarks.
export OMP_WAIT_POLICY := PASSIVE
# Every chapter's figures use the book's Matplotlib settings (text sized for the page column).
export MATPLOTLIBRC := $(CURDIR)/book/matplotlibrc

setup: check-tools $(PY_STAMP) $(LAB_OVERRIDES) $(JS_STAMP)

check-tools:
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "error: '$(PYTHON)' was not found. tfbook needs Python 3.11."; \
	  echo "  Debian/Ubuntu: apt-get install python3.11 python3.11-venv   (or pyenv install 3.11)"; \
	  echo "  Or point the Makefile at one: make book PYTHON=/path/to/python3.11"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \
	  echo "error: '$(PYTHON)' is not a working Python 3.11 ($$($(PYTHON) --version 2>&1 | head -1))."; \
	  echo "  tfbook needs Python 3.11: apt-get install python3.11 python3.11-venv (or pyenv install 3.11),"; \
	  echo "  or give one: make book PYTHON=/path/to/python3.11"; exit 1; }
	@command -v $(NPM) >/dev/null 2>&1 || { \
	  echo "error: '$(NPM)' was not found. The book serves MathJax and the widget JavaScript itself,"; \
	  echo "  installed from the npm registry. Install Node.js 18+ with npm: apt-get install nodejs npm"; \
	  exit 1; }

$(PY_STAMP): $(PY_REQS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -r requirements.txt -r requirements-test.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# JupyterLab opens the .md chapters as notebooks (jupytext) when double-clicked, without the
# news prompt; re-copied whenever the overrides change.
$(LAB_OVERRIDES): scripts/jupyterlab-overrides.json $(PY_STAMP)
	mkdir -p $(dir $@)
	cp scripts/jupyterlab-overrides.json $@

$(JS_STAMP): package.json package-lock.json
	$(NPM) ci --no-audit --no-fund --loglevel=error
	touch $@

# Copy the pinned front-end files to _vendor/, which Sphinx copies to the site root
# (html_extra_path) without adding them to every page.
vendor: $(JS_STAMP) $(PY_STAMP)
	$(BIN)/python scripts/vendor_assets.py

book: setup vendor
	$(BIN)/python scripts/build_book.py build --all -W -n --keep-going . || { \
	  echo "error: the book build failed (see the chapter and cell named above)."; exit 1; }
	@echo
	@echo "The book is built: open $(CURDIR)/_build/html/index.html"

# The tests run in TEST_JOBS processes (pytest-xdist; a chapter's cells and each test file
# stay in one process) beside the book build, which executes TFBOOK_BUILD_JOBS chapters at a
# time (default: one a core). CONTRIBUTING.md, "Where the time of make test goes", says how
# the time divides.
TEST_JOBS ?= 2
test: setup vendor check-chromium
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile --durations=25 \
	  --junitxml=_build/test-report.xml; status=$$?; \
	  $(BIN)/python scripts/time_report.py _build; exit $$status

# The browser tests open the built pages in Chromium or Chrome, driven by Playwright: Debian's
# `chromium`, another one where it usually lives, or the executable named by $$CHROMIUM.
check-chromium: $(PY_STAMP)
	@$(BIN)/python -m tests.browser >/dev/null

lab: setup
	$(BIN)/jupyter lab --ServerApp.open_browser=False --ServerApp.root_dir=$(CURDIR)/book \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

PORT ?= 8000
serve:
	@test -f _build/html/index.html || { echo "error: the book is not built yet: run make book first"; exit 1; }
	@echo "Serving the book on http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory _build/html $(PORT)

clean:
	rm -rf _build _vendor
