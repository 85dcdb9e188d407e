# Queries, Keys and Values: build the book and run every check.
#
#   make book      create .venv if needed, build the HTML into _build/html
#   make test      lint, unit tests, page shape, nbval (strict), strict book build, browser check
#
# Everything runs from the project's own .venv (created with python3 -m venv and
# installed from requirements.txt). The install is redone only when
# requirements.txt or pyproject.toml change (the stamp file .venv/.installed).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON3 ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
HTML := _build/html
# Pages: answer pages in book/, their deeper pages in a folder of the same name.
NOTEBOOKS := $(sort $(wildcard book/*.ipynb book/*/*.ipynb))
SANITIZE := book/nbval_sanitize.cfg
# `make execute NB=book/x.ipynb` re-runs one chapter; the default is all of them.
NB ?= $(NOTEBOOKS)
JB_BUILD := $(BIN)/jupyter-book build . --builder html
# Stages of `make test`, in order; each one is also a target of its own.
STAGES := lint unit shape nbval html-strict browser

# Reproducible runs: the same hash seed in every kernel. (Leave MPLBACKEND unset:
# kernels pick matplotlib's inline backend themselves.)
export PYTHONHASHSEED := 0
export PYDEVD_DISABLE_FILE_VALIDATION := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help book test $(STAGES) execute env clean test-oldest test-colab stability

help:
	@echo "make book         build the HTML book into $(HTML) (creates $(VENV) when missing)"
	@echo "make test         every check: $(STAGES) (unchanged stages are skipped; FORCE=1 runs all)"
	@echo "make lint         ruff on the package, tests, scripts and notebooks; mypy --strict on the package;"
	@echo "                  the GitHub workflows against GitHub's schema and zizmor's audit (offline)"
	@echo "make unit         pytest on tests/ (without the browser check)"
	@echo "make shape        measure every page against its shape's budget and print the table"
	@echo "make nbval        re-run every page, perturbed as another CPU would, and compare with its stored outputs"
	@echo "                  (PERTURB= runs them unperturbed)"
	@echo "make stability    which stored outputs of a page change on another CPU (NB=book/x.ipynb)"
	@echo "make html-strict  build the book from scratch with warnings as errors"
	@echo "make browser      open every built page in headless Chromium (screenshots: _build/screenshots)"
	@echo "make execute      re-run notebooks in place (NB=book/x.ipynb for one)"
	@echo "make test-oldest  the unit tests on the version floors (Python 3.10; PYTHON=...)"
	@echo "make test-colab   the same on Colab's versions, TensorFlow included (Python 3.13; PYTHON=...)"
	@echo "make clean        remove the built book and caches (keeps $(VENV))"

# --- the environment ---------------------------------------------------------

# The oldest Python every pin in requirements.txt supports (tests/test_repository.py
# checks it); the package itself runs from Python 3.10 (make test-oldest).
MIN_PYTHON := 3.11.5
$(PY):
	@$(PYTHON3) -c 'import sys; sys.exit(sys.version_info < tuple(map(int, "$(MIN_PYTHON)".split("."))))' || \
	    { echo "make: the pinned environment needs Python $(MIN_PYTHON) or newer; $(PYTHON3) is $$($(PYTHON3) -V 2>&1). Use PYTHON3=/path/to/python3.11 (or newer)." >&2; exit 1; }
	$(PYTHON3) -m venv $(VENV)

# Everything installed is byte-compiled once, here: where PYTHONDONTWRITEBYTECODE is set (as in
# the developers' shells here), Python never keeps the bytecode it compiles at import, and
# every kernel would compile torch again (with no bytecode, nbval took 376 s, not 201 s).
# pip compiles file by file on one core; compileall -j 0 does the same on every core once
# pip is done (the whole install: 70 s, not 83 s, on two cores).
$(STAMP): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	@# A few packages ship files that do not compile (pip ignores them too): exit status 1.
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
	@touch $@

env: $(STAMP)

# --- the book ------------------------------------------------------------------

book: $(STAMP)
	$(JB_BUILD)
	@echo "The book is built: open file://$(CURDIR)/$(HTML)/index.html"

# --- the checks ----------------------------------------------------------------

# Each stage records its success in $(PASSED)/<stage> and runs again only when one
# of its inputs is newer: a second `make test` with nothing changed takes seconds.
# A fresh clone (CI) has no records, so everything runs. FORCE=1 re-runs all.
PASSED := _build/.passed
PACKAGE := $(shell find src -name '*.py') pyproject.toml
TESTS := $(shell find tests -name '*.py')
BOOK_SOURCES := $(wildcard book/*.md book/*.bib book/_ext/*.py book/_ext/static/*) $(NOTEBOOKS) _config.yml _toc.yml

define passed
	@mkdir -p $(PASSED) && touch $(PASSED)/$(1)
endef

lint: $(PASSED)/lint
	@echo "lint: passed (re-runs when one of its inputs changes)"
WORKFLOWS := $(wildcard .github/workflows/*.yml)
$(PASSED)/lint: $(STAMP) $(PACKAGE) $(TESTS) $(NOTEBOOKS) $(WORKFLOWS) $(wildcard scripts/*.py benchmarks/*.py book/*.py)
	$(BIN)/ruff check .
	@# The chapters' code fits the page's code column: 88 characters (the package: 110).
	$(BIN)/ruff check --line-length 88 --select E501 $(NOTEBOOKS)
	$(BIN)/mypy --strict src/qkv tests/typing
	@# The GitHub workflows: GitHub's schema (bundled, offline) and a security audit.
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows $(WORKFLOWS)
	$(BIN)/zizmor --offline --quiet .github/workflows
	$(call passed,lint)

# The tests, and the examples in the package's docstrings (the API page shows them), in
# two processes (pytest-xdist).
unit: $(PASSED)/unit
	@echo "unit: passed (re-runs when one of its inputs changes)"
$(PASSED)/unit: $(STAMP) $(PACKAGE) $(TESTS)
	$(PY) -m pytest -n 2 tests src/qkv --doctest-modules --ignore=tests/browser
	$(call passed,unit)

# Cheap (it reads the notebooks), so it always runs: the table is in every `make test`.
shape: $(STAMP)
	$(PY) scripts/page_shape.py

# Stored outputs must be the same on every machine, but another CPU (AVX-512 or AVX2,
# Intel, AMD or ARM) or thread count changes the low digits of float32 sums. So every
# page runs perturbed the same way: torch's kernels without SIMD and one thread per
# kernel, which changes low digits here as another machine does (CONTRIBUTING.md,
# "Stored outputs are the same on every machine"). A number stored with more digits
# than every machine agrees on fails here, not on a reader's machine. With one thread
# each, two kernels share the two cores. `make nbval PERTURB=` runs the pages as they
# are, one at a time.
PERTURB ?= ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
NBVAL_WORKERS := $(if $(PERTURB),-n 2 --dist loadfile,)
nbval: $(PASSED)/nbval
	@echo "nbval: passed (re-runs when one of its inputs changes)"
$(PASSED)/nbval: $(STAMP) $(PACKAGE) $(NOTEBOOKS) $(SANITIZE) book/conftest.py
	env $(PERTURB) $(PY) -m pytest -p no:cacheprovider --nbval --nbval-current-env \
	    --nbval-sanitize-with $(SANITIZE) $(NBVAL_WORKERS) $(NOTEBOOKS)
	$(call passed,nbval)

# Which digits of a page's outputs change under each perturbation, listed.
stability: $(STAMP)
	$(PY) scripts/output_stability.py $(NB)

# From scratch, so that every page's warnings are reported (an incremental build
# stays quiet about unchanged pages) and no page removed from _toc.yml lingers.
html-strict: $(PASSED)/html-strict
	@echo "html-strict: passed (re-runs when one of its inputs changes)"
$(PASSED)/html-strict: $(STAMP) $(PACKAGE) $(BOOK_SOURCES)
	rm -rf $(HTML) _build/.doctrees
	$(JB_BUILD) --all --warningiserror --nitpick --keep-going
	$(call passed,html-strict)

# Installs Debian's Chromium when it is missing and it can (root with apt-get), then runs
# two Chromiums at once on the site html-strict built (its prerequisite, so the site is
# up to date; built again only if it was deleted since); screenshots of every page go to
# _build/screenshots.
browser: $(PASSED)/browser
	@echo "browser: passed (re-runs when one of its inputs changes)"
$(PASSED)/browser: $(PASSED)/html-strict $(wildcard tests/browser/*.py)
	scripts/system-packages chromium
	@[ -f $(HTML)/index.html ] || $(JB_BUILD) --quiet
	$(PY) -m pytest -p no:cacheprovider tests/browser --browser -n 2
	$(call passed,browser)

# Runs every stage even when one fails, then fails if any did. html-strict keeps one core
# busy (Sphinx reads the pages one by one) for about 35 s, so lint and then unit run beside
# it, their output printed after it (about 10 s less than one after the other, on two
# cores); nbval and browser use both cores and run alone, in order.
BESIDE_HTML := lint unit
test: $(STAMP)
	@if [ -n "$(FORCE)" ]; then rm -rf $(PASSED); fi; \
	passed=0; failed=0; failures=""; times=""; beside_log=$$(mktemp); \
	record() { times="$$times $$1 $$3 s;"; \
	    if [ "$$2" -eq 0 ]; then passed=$$((passed + 1)); \
	    else failed=$$((failed + 1)); failures="$$failures $$1"; fi; }; \
	for stage in shape nbval html-strict browser; do \
	    if [ $$stage = html-strict ]; then \
	        ( for other in $(BESIDE_HTML); do \
	              start=$$(date +%s); status=0; \
	              echo "=== make $$other (ran beside html-strict)" >> "$$beside_log"; \
	              $(MAKE) $$other >> "$$beside_log" 2>&1 || status=$$?; \
	              echo "$$other $$status $$(( $$(date +%s) - start ))" >> "$$beside_log.status"; \
	          done ) & beside=$$!; \
	    fi; \
	    echo "=== make $$stage"; start=$$(date +%s); status=0; \
	    $(MAKE) $$stage || status=$$?; \
	    record $$stage $$status $$(( $$(date +%s) - start )); \
	    if [ $$stage = html-strict ]; then \
	        wait $$beside || true; cat "$$beside_log"; \
	        for other in $(BESIDE_HTML); do \
	            line=$$(grep "^$$other " "$$beside_log.status" || echo "$$other 1 0"); \
	            record $$line; \
	        done; \
	        rm -f "$$beside_log" "$$beside_log.status"; \
	    fi; \
	done; \
	echo "stage times:$$times"; \
	if [ $$failed -gt 0 ]; then echo "failed:$$failures"; fi; \
	echo "summary: $$passed passed, $$failed failed"; \
	test $$failed -eq 0

# --- other versions --------------------------------------------------------------

# The unit tests and every chapter on another set of versions (constraints/*.txt), in
# .venv-oldest or .venv-colab, built with the Python each set names (PYTHON=... to
# point at it). They download large wheels, so `make test` does not run them; the
# scheduled workflow (.github/workflows/versions.yml) does. The script needs only the
# standard library, so any python3 runs it (not .venv: it may be the wrong version).
test-oldest test-colab: test-%:
	$(PYTHON3) scripts/test_versions.py $* $(if $(PYTHON),--python $(PYTHON))

# --- maintenance ---------------------------------------------------------------

execute: $(STAMP)
	$(PY) scripts/execute_notebooks.py $(NB)

clean:
	rm -rf _build .pytest_cache .ruff_cache .hypothesis .jupyter_cache jupyter_execute
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
