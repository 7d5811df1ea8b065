# Both targets create .venv in the repo root on first use and reinstall when setup.py changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LABSE_DATA ?= $(abspath ../shared/data)
export LABSE_DATA
# Beam, TensorFlow and torch each start thread pools per process; on 2 cores more threads only thrash.
export TF_CPP_MIN_LOG_LEVEL ?= 3

.PHONY: venv demo test test-fast docs bench clean chromium

venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip wheel setuptools
	# torch first and pinned: the local CPU wheel; an unpinned torch would pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m recipes.demo --data $(LABSE_DATA) --output demo_out

# The browser test looks at labse-report's page in Debian's chromium: installed here when absent
# (as root, from Debian's archive); elsewhere install the `chromium` package by hand.
CHROMIUM := $(shell command -v chromium 2>/dev/null)

chromium:
ifeq ($(CHROMIUM),)
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "make test: the browser test needs Debian's chromium package (apt-get install chromium)"; fi
endif

test: $(STAMP) chromium
	$(PY) -m pytest tests -n 2

test-fast: $(STAMP)
	$(PY) -m pytest tests -m "not slow"

# The docs site (mkdocs.yml, docs/) into site/; --strict fails on any warning. Refresh the generated
# option blocks of docs/reference/ first with `$(PY) docs/gen_reference.py` after changing a command.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf demo_out bench_out site .pytest_cache
