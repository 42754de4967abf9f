# Two entry points (README): `make demo` and `make test`. Both set up what they
# need on a fresh Debian machine: a .venv with kvscope[vllm,dev] (vLLM 0.26.0),
# and for the tests .venv034 (vLLM 0.34.0) and .venv033 (vLLM 0.33.0) plus Debian's
# prometheus/promtool and victoria-metrics/vmalert.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.kvscope-installed
# The oldest and the newest supported vLLM (pyproject: vllm>=0.26.0,<=0.34.0); `make test` runs
# the whole suite on both ends of the range, and the release checks (below) on 0.33.0.
VLLM_OLDEST := 0.26.0
VLLM_NEWEST := 0.34.0
VENV_NEWEST := .venv034
STAMP_NEWEST := $(VENV_NEWEST)/.kvscope-installed
VLLM_PREVIOUS := 0.33.0
VENV_PREVIOUS := .venv033
STAMP_PREVIOUS := $(VENV_PREVIOUS)/.kvscope-installed

# What `make check-release` runs on a vLLM release: the compat layer and its boundary, every CPU
# scenario's verdict against what the engine did (a drafter's group: the veto by release), the vLLM objects kvscope must leave untouched,
# and kv-diagnose and the dashboards' native row on a stock engine.
RELEASE_TESTS := tests/unit/test_compat_boundary.py tests/connector/test_scheduler_scenarios.py \
  tests/connector/test_vllm_objects_untouched.py tests/connector/test_plugin.py \
  tests/diagnostics/test_scenarios.py tests/diagnostics/test_drafter_group.py \
  tests/diagnostics/test_native_live.py tests/dashboards/test_queries_native.py

.PHONY: demo test test-newest test-previous lint setup setup-newest setup-previous prometheus \
  check-release

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[vllm,dev]' 'vllm==$(VLLM_OLDEST)'
	touch $(STAMP)

setup: $(STAMP)

# Later vLLMs share most of their ~200 dependencies with 0.26 at the same versions. Rather
# than downloading and unpacking them again (this machine's package index sends no cache
# headers, so pip caches nothing), start from hard links to an older venv's packages and let
# pip swap those that differ (torch 2.14.0, vllm, ...). pip replaces files (unlink + new file),
# never writes into a linked one, so the older venv is untouched.
# tools/vllm_release.py installs vLLM without flashinfer-python, which vLLM's CPU path never
# imports and whose exact pin (0.34.0: ==0.7.3) this package index lacks.
define release_venv  # $(1) venv, $(2) vLLM release, $(3) venv to link from
	rm -rf $(1)
	$(PY) -m venv --without-pip $(1)
	cp -al $(3)/lib/. $(1)/lib/
	$(1)/bin/python tools/vllm_release.py $(2)
	touch $(1)/.kvscope-installed
endef

$(STAMP_PREVIOUS): $(STAMP)
	$(call release_venv,$(VENV_PREVIOUS),$(VLLM_PREVIOUS),$(VENV))

$(STAMP_NEWEST): $(STAMP_PREVIOUS)
	$(call release_venv,$(VENV_NEWEST),$(VLLM_NEWEST),$(VENV_PREVIOUS))

setup-previous: $(STAMP_PREVIOUS)
setup-newest: $(STAMP_NEWEST)

# The PromQL engines the tests prove (docs/proof.md): Debian's prometheus (prometheus, promtool) and
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
	$(VENV)/bin/ruff check connector exporters dashboards diagnostics kvscope tests benchmarks tools

test: $(STAMP) prometheus lint
	$(VENV)/bin/kvscope dashboards --check && $(VENV)/bin/kvscope rules --check
	@$(VENV)/bin/python -c 'import vllm; print("== tests on vLLM", vllm.__version__)'
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider
	$(MAKE) test-newest
	$(MAKE) test-previous

# The same suite on the newest vLLM (connector both sides, checksums and refusals,
# every CPU scenario, every kv-diagnose verdict, the live dashboard queries).
test-newest: $(STAMP_NEWEST) prometheus
	@$(VENV_NEWEST)/bin/python -c 'import vllm; print("== tests on vLLM", vllm.__version__)'
	$(VENV_NEWEST)/bin/python -m pytest -q -p no:cacheprovider

# The release checks on 0.33.0, the release between (its native captures stay proven too).
test-previous: $(STAMP_PREVIOUS) prometheus
	@$(VENV_PREVIOUS)/bin/python -c 'import vllm; print("== release checks on vLLM", vllm.__version__)'
	$(VENV_PREVIOUS)/bin/python -m pytest -q -p no:cacheprovider $(RELEASE_TESTS) \
	  tests/diagnostics/test_native.py tests/dashboards/test_queries_reality.py

# `make check-release VLLM=x.y.z`: an environment for any vLLM release (.venv-x.y.z, linked
# from CHECK_BASE: a venv whose torch matches saves pip that download), the release checks on
# it, and what broke. docs/releases.md says what to do with a new vLLM.
CHECK_BASE ?= $(VENV_NEWEST)
.venv-%/.kvscope-installed: $(STAMP_NEWEST)
	$(call release_venv,.venv-$*,$*,$(CHECK_BASE))

check-release: prometheus
	@test -n "$(VLLM)" || { echo "usage: make check-release VLLM=x.y.z"; exit 2; }
	$(MAKE) .venv-$(VLLM)/.kvscope-installed
	@.venv-$(VLLM)/bin/python -c 'import vllm; print("== release checks on vLLM", vllm.__version__)'
	.venv-$(VLLM)/bin/python -m pytest -q -p no:cacheprovider -rfE $(RELEASE_TESTS)
