"""The tiers behind vLLM's offloading manager, observed per job, never per key looked up.

:mod:`.taps`: taps on the tier instances (promotions, cascades, refusals);
:mod:`.probe`: its own thread, data a tier confirmed written that is gone;
:mod:`.store_refusals`: keys of store jobs refused for lack of space;
:mod:`.group_stores`: store jobs' keys and the primary tier's keys per KV group.
No re-exports here.
"""
