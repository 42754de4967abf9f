"""Where a window comes from: a live scrape, Prometheus range queries or a recorded bundle.

Each source yields a :class:`~kvscope.diagnostics.model.RawWindow` of the series kv-diagnose
reads (:mod:`.wanted`), bounded in size and time (:mod:`.limits`). No re-exports here: a
package ``__init__`` that imports its modules would make circles with them.
"""
