"""Known vLLM bugs that kill the engine, contained: the call vLLM would raise on is answered
as vLLM's own quiet path, counted, and logged once. Everywhere else kvscope only observes.

One today, ``store_after_finish`` (``compat.store_after_finish``): on vLLM 0.26 with the
tiering manager, a store prepared for a request whose tiering state vLLM already deleted
raises ``KeyError`` out of the scheduler's step. kvscope answers that store "nothing to
store" before vLLM's manager sees it: no row is taken and none evicted, so the rows other
requests stored stay; the finished request's last chunks are not offloaded (its first ones,
stored earlier, are). A store vLLM's primary tier refuses anyway (no free row: vLLM returns
None before it reads the state, without raising) is left to vLLM, untouched.

Installed only on a release with the bug, and only with ``contain_vllm_faults`` on (the
default): on a fixed release ``prepare_store`` stays the proxy's own tap. The check is one
dict membership test per store job on vLLM's scheduler thread, inline in the proxy's tap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kvscope.connector.compat import store_after_finish
from kvscope.exporters.recorder import Recorder
from kvscope.exporters.signals import VLLM_FAULTS_CONTAINED, ErrorSite, VllmFault

logger = logging.getLogger("kvscope")

STORE_AFTER_FINISH_LOG = (
    "kvscope: contained vLLM %s's store-after-finish bug (vLLM #49635, fixed in vLLM %s by "
    "#49671): a store was prepared for request %s after vLLM had deleted its tiering state; "
    "vLLM would have raised KeyError and stopped the engine. kvscope skipped that store (the "
    "finished request's last chunks are not offloaded; no row taken, nothing else changed). "
    "Upgrade vLLM to %s or later. Further occurrences are only counted in "
    "%s{fault=\"store_after_finish\"}."
)


def install(proxy: Any, manager: Any, recorder: Recorder, enabled: bool,
            version: str = store_after_finish.VLLM_VERSION) -> bool:
    """Wrap ``proxy``'s ``prepare_store`` where vLLM ``version`` raises on a store after
    finish and containment is on; True when wrapped."""
    states = store_after_finish.request_states(manager, version) if enabled else None
    if states is None:
        return False
    proxy.guard_store(states, lambda tap: _skip_store_after_finish(tap, states, manager,
                                                                   recorder, version))
    return True


def _skip_store_after_finish(tap: Callable[..., Any], states: dict, manager: Any,
                             recorder: Recorder, version: str) -> Callable[..., Any]:
    labels = (VllmFault.STORE_AFTER_FINISH.value,)
    logged = [False]

    # a job of a request no longer live in vLLM's manager (the proxy's tap tests that inline)
    def prepare_store(keys, req_context, *args, **kwargs):
        try:
            if not store_after_finish.raises(manager, keys):  # vLLM refuses it quietly
                return tap(keys, req_context, *args, **kwargs)
            out = store_after_finish.nothing_to_store(manager, req_context)
        except Exception as exc:  # kvscope's answer failed: vLLM's own call, as without it
            recorder.error(ErrorSite.MANAGER, exc)
            return tap(keys, req_context, *args, **kwargs)
        recorder.inc(VLLM_FAULTS_CONTAINED, labels)
        if not logged[0]:
            logged[0] = True
            logger.warning(STORE_AFTER_FINISH_LOG, version, store_after_finish.FIXED_IN,
                           req_context.req_id, store_after_finish.FIXED_IN,
                           VLLM_FAULTS_CONTAINED.name)
        return out

    return prepare_store
