"""kv-diagnose: source -> typed evidence -> classifiers -> report.

Python API (what ``kvscope demo`` calls)::

    from kvscope.diagnostics import diagnose_scrape, format_text
    report = diagnose_scrape(["http://127.0.0.1:9400/metrics"], interval=1.0)
    print(format_text(report)); report.exit_code; report.top.id

Never imports vLLM: an operator runs it on a laptop.
"""

from .cli import diagnose_bundle, diagnose_prometheus, diagnose_scrape, main
from .model import DiagnoseError, Finding
from .report import SCHEMA_VERSION, Report, format_text
from .thresholds import Thresholds

__all__ = [
    "SCHEMA_VERSION",
    "DiagnoseError",
    "Finding",
    "Report",
    "Thresholds",
    "diagnose_bundle",
    "diagnose_prometheus",
    "diagnose_scrape",
    "format_text",
    "main",
]
