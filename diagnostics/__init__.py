"""kv-diagnose: source -> typed evidence -> classifiers -> report.

Python API (what ``kvscope demo`` calls)::

    from kvscope.diagnostics import diagnose_scrape, format_text
    report = diagnose_scrape(["http://127.0.0.1:9400/metrics"], interval=1.0)
    print(format_text(report)); report.exit_code; report.top.id

Never imports vLLM: an operator runs it on a laptop. The names below are imported
on first use, so ``python -m kvscope.diagnostics.cli`` runs a module the package
has not imported yet (no runpy warning).
"""

from __future__ import annotations

import importlib

_FROM = {
    "diagnose_bundle": ".cli", "diagnose_prometheus": ".cli", "diagnose_scrape": ".cli",
    "main": ".cli", "DiagnoseError": ".model", "Finding": ".model",
    "SCHEMA_VERSION": ".report.diagnosis", "Report": ".report.diagnosis",
    "format_text": ".report.diagnosis",
    "Thresholds": ".thresholds",
}
__all__ = sorted(_FROM)


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_FROM[name], __name__), name)
    globals()[name] = value
    return value
