"""Every classifier run on one window's evidence, and what could not be checked.

:mod:`.diagnose` runs the classifiers and ranks what holds; the window checks say when a
healthy verdict would be no verdict: several engines summed (:mod:`.one_engine`), kvscope's
own errors (:mod:`.telemetry_gaps`), a worker rank missing (:mod:`.ranks`).
:mod:`.per_engine` cuts a window of several engines into one verdict each. No re-exports here.
"""
