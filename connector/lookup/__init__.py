"""A request's lookup rounds, from vLLM's prefix scan to the round's verdict.

On vLLM's scheduler thread each lookup's result is recorded into the round's slots
(:mod:`.rounds`): by the manager proxy's per-key tap (:mod:`.manager_proxy`) or read from
vLLM's scan (:mod:`.prefix_scan`, with its fast paths :mod:`.scan_cache` and
:mod:`.bare_rest`, and a scan's evictions kept flat in :mod:`.evictions`). Each ended round
is judged off that thread: its verdict and row ceiling (:mod:`.round_verdicts`), restore
coverage (:mod:`.coverage`), span (:mod:`.round_spans`); meanwhile each request's state
(:mod:`.request_states`) and where its restore's time goes (:mod:`.restore_clock`). No
re-exports here: a package ``__init__`` that imports its modules would make circles with
them.
"""
