"""kvscope: observability for vLLM KV-cache offloading.

Subpackages (installed from the repository's top-level folders):

* ``kvscope.connector``   - ObservedOffloadingConnector (needs the ``vllm`` extra)
* ``kvscope.exporters``   - the signal contract, Prometheus and OpenTelemetry wiring
* ``kvscope.dashboards``  - Grafana dashboards and Prometheus rules as code
* ``kvscope.diagnostics`` - kv-diagnose, the incident CLI
"""

__version__ = "0.1.0"
