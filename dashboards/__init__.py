"""Grafana dashboards and Prometheus rules for KV offloading, generated from the signal contract.

* ``config.Config`` / ``config.DEFAULT`` - every operator-facing knob (selectors, thresholds,
  windows, severities, dashboard UIDs, runbook URLs);
* ``overview`` / ``incident`` - the two dashboards (grafana-foundation-sdk builders, Grafana 11.6);
* ``rules`` - recording and alerting rules;
* ``generate(out_dir)`` / ``check(out_dir)`` (module ``artifacts``) - write / diff the files that are
  committed under ``dashboards/generated/``;
* ``cli`` - the ``kvscope dashboards`` and ``kvscope rules`` subcommands.
"""

from .artifacts import check, generate

__all__ = ["check", "generate"]
