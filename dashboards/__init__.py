"""Grafana dashboards and Prometheus rules for KV offloading, generated from the signal contract.

* ``config.Config`` / ``config.DEFAULT`` - every operator-facing knob (selectors, thresholds,
  windows, severities, dashboard UIDs, runbook URLs);
* ``overview`` / ``incident`` - the two dashboards (grafana-foundation-sdk builders, Grafana 11.6);
* ``rules`` - recording and alerting rules;
* ``artifacts.generate(out_dir)`` / ``artifacts.check(out_dir)`` - write / diff the files that
  are committed under ``dashboards/generated/``;
* ``cli`` - the ``kvscope dashboards`` and ``kvscope rules`` subcommands.

The package imports none of them: its modules import each other (``from . import common``),
which would circle back through a package that imported them.
"""
