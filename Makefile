# Two entry points (README): `make demo` and `make test`. Both set up what they
# need on a fresh Debian machine: a .venv with kvscope[vllm,dev] (vLLM 0.26.0),
# and for the tests a second one with vLLM 0.33.0 plus Debian's prometheus/promtool and
# victoria-metrics/vmalert.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.kvscope-installed
# The oldest and the newest supported vLLM (pyproject: vllm>=0.26.0,<=0.33.0); `make test` runs
# the suite on both ends of the range.
VLLM_OLDEST := 0.26.0
VLLM_NEWEST := 0.33.0
VENV_NEWEST := .venv033
STAMP_NEWEST := $(VENV_NEWEST)/.kvscope-installed

.PHONY: demo test test-newest lint setup setup-newest prometheus

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[vllm,dev]' 'vllm==$(VLLM_OLDEST)'
	touch $(STAMP)

setup: $(STAMP)

# vLLM 0.33 shares ~170 of its ~200 dependencies with 0.26 at the same versions.
# Rather than downloading and unpacking them again (this machine's package index
# sends no cache headers, so pip caches nothing), start from hard links to .venv's
# packages, then let pip swap the ~30 that differ (torch 2.14.0, vllm 0.33.0, ...).
# pip replaces files (unlink + new file), never writes into a linked one, so .venv
# is untouched.
$(STAMP_NEWEST): $(STAMP)
	rm -rf $(VENV_NEWEST)
	$(PY) -m venv --without-pip $(VENV_NEWEST)
	cp -al $(VENV)/lib/. $(VENV_NEWEST)/lib/
	$(VENV_NEWEST)/bin/python -m pip install -q -e '.[vllm,dev]' 'vllm==$(VLLM_NEWEST)'
	touch $(STAMP_NEWEST)

setup-newest: $(STAMP_NEWEST)

# The PromQL engines the tests prove (README): Debian's prometheus (prometheus, promtool) and
# victoria-metrics (victoria-metrics, vmalert), one apt-get when any binary is missing. The tests
# start their own servers on 127.0.0.1; where systemd runs, the packages also start their
# services (:9090, :8428) as Debian installs them.
PROMQL_BINARIES := prometheus promtool victoria-metrics vmalert
prometheus:
	@for b in $(PROMQL_BINARIES); do command -v $$b >/dev/null || missing=1; done; \
	[ -z "$$missing" ] || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    prometheus victoria-metrics; }

demo: $(STAMP)
	$(VENV)/bin/kvscope demo capacity-ceiling

lint: $(STAMP)
	$(VENV)/bin/ruff check connector exporters dashboards diagnostics kvscope tests benchmarks

test: $(STAMP) prometheus lint
	$(VENV)/bin/kvscope dashboards --check && $(VENV)/bin/kvscope rules --check
	@$(VENV)/bin/python -c 'import vllm; print("== tests on vLLM", vllm.__version__)'
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider
	$(MAKE) test-newest

# The same suite on vLLM 0.33 (connector both sides, checksums and refusals,
# every CPU scenario, every kv-diagnose verdict, the live dashboard queries).
test-newest: $(STAMP_NEWEST) prometheus
	@$(VENV_NEWEST)/bin/python -c 'import vllm; print("== tests on vLLM", vllm.__version__)'
	$(VENV_NEWEST)/bin/python -m pytest -q -p no:cacheprovider
