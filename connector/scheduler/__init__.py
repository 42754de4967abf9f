"""The scheduler role's wiring: :mod:`.observer` (``SchedulerObserver``, a thin
coordinator over the rooms of lookup/, tiers/, integrity/ and export/) and :mod:`.hooks`
(the scheduler-role connector calls, closures bound once per connector). No re-exports
here.
"""
