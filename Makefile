# Two entry points (README): `make demo` and `make test`. Both set up what they
# need on a fresh Debian machine: a .venv with kvscope[vllm,dev], and for the
# tests Debian's prometheus/promtool.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.kvscope-installed

.PHONY: demo test lint setup prometheus

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[vllm,dev]'
	touch $(STAMP)

setup: $(STAMP)

prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

demo: $(STAMP)
	$(VENV)/bin/kvscope demo capacity-ceiling

lint: $(STAMP)
	$(VENV)/bin/ruff check connector exporters dashboards diagnostics kvscope tests benchmarks

test: $(STAMP) prometheus lint
	$(VENV)/bin/kvscope dashboards --check && $(VENV)/bin/kvscope rules --check
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider
