"""``kv-diagnose plan``: how many primary rows a target coverage needs.

:mod:`.inputs` reads a window (or the command line) into :class:`.model.PlanInputs`;
:mod:`.coverage` sizes the plan; :mod:`.format` renders it as text or JSON. No re-exports
here.
"""
