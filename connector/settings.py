"""kvscope's options (``kv_connector_extra_config["kvscope"]``), checked at start-up.

Its own room: what an operator may set, the defaults, and the checksum policy that can be
honoured on this vLLM and model (``effective_policy``), apart from the connector's wiring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvscope.connector.aggregator import INTERVAL_S as FLUSH_INTERVAL_S
from kvscope.connector.compat import load_failures
from kvscope.connector.integrity.checksums import ALGORITHMS, DEFAULT_ALGORITHM, ChecksumPolicy
from kvscope.connector.integrity.shared_region import ChecksumScope
from kvscope.connector.tiers.probe import DEFAULT_INTERVAL_S
from kvscope.exporters.prometheus import DEFAULT_ADDR

SETTINGS_KEY = "kvscope"


@dataclass(frozen=True)
class Settings:
    """``kv_connector_extra_config["kvscope"]``."""

    # Standalone /metrics port of the scheduler process; worker rank r serves on
    # exporter_port + 1 + r. None: only vLLM's own /metrics carries kvscope series.
    exporter_port: int | None = None
    exporter_addr: str = DEFAULT_ADDR
    # off | observe | refuse (default): what a rank does when its copy of a
    # promoted row differs from the scheduler host's. Pair "refuse" with
    # kv_load_failure_policy="recompute" so refused loads are recomputed.
    checksum_policy: str = ChecksumPolicy.REFUSE
    checksum_algorithm: str = DEFAULT_ALGORITHM
    # unshared (default) | all: whose slots are digested. unshared: only ranks that do not
    # map the scheduler's own region file (another node's /dev/shm), the ones that can load
    # stale rows; a rank mapping that file reads the promotion's bytes themselves
    # (shared_region.py). all: every rank, which also catches bytes changed in place
    # between a promotion and its load, for a pass over every promoted byte on both sides.
    checksum_scope: str = ChecksumScope.UNSHARED
    # Threads that digest one promotion's or load's rows together (the caller is one of
    # them); None: half the CPUs, at most 8; 1: all on the calling thread.
    checksum_threads: int | None = None
    # Spans go to the tracer provider the application installed (vLLM's
    # --otlp-traces-endpoint). True: when there is none, kvscope installs an
    # OTLP/HTTP exporter itself (needs kvscope[otlp]; OTEL_EXPORTER_OTLP_* env).
    otlp_traces: bool = False
    # Seconds between two checks, off the scheduler thread, that the data the secondary
    # tiers confirmed written is still there (tiers/probe.py); 0: no probe.
    tier_probe_interval_s: float = DEFAULT_INTERVAL_S
    # Seconds between two flushes while the engine is busy, on the scheduler side (the
    # aggregator thread: journal applied, rooms, gauges, vLLM's stats object) and on each
    # rank (its transfer tally). It bounds how late kvscope's series reach vLLM's /metrics
    # (this plus one step; a scrape of kvscope's own endpoint drains at once) and how stale
    # the snapshot gauges get while busy; longer: fewer wake-ups competing with vLLM's
    # engine thread for the GIL. A finite number > 0.
    flush_interval_s: float = FLUSH_INTERVAL_S
    # True: record every key the connector looks up, also where vLLM's prefix scan tells
    # them (vLLM's CPU manager alone, one full-attention KV group: prefix_scan.py, one
    # tap per round instead of one per key). The same series either way; this is the
    # way back should a vLLM release change what the scan's answer means.
    per_key_lookups: bool = False
    # True: where the installed vLLM has a known bug that raises out of its scheduler step
    # (vLLM 0.26's store after finish: connector/contained_faults.py), kvscope answers that
    # call as vLLM's quiet path instead, counts it (kvscope_vllm_faults_contained_total) and
    # logs it once. False: vLLM raises, as it would without kvscope. Nothing is wrapped on a
    # release without such a bug, either way.
    contain_vllm_faults: bool = True

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> Settings:
        raw = dict((extra or {}).get(SETTINGS_KEY) or {})
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown kvscope settings: {sorted(unknown)}")
        s = cls(**raw)
        if s.checksum_policy not in ChecksumPolicy.ALL:
            raise ValueError(f"checksum_policy must be one of {ChecksumPolicy.ALL}")
        if not s.tier_probe_interval_s >= 0:
            raise ValueError("tier_probe_interval_s must be >= 0 (0: no tier probe)")
        f = s.flush_interval_s
        if isinstance(f, bool) or not isinstance(f, int | float) or not math.isfinite(f) \
                or f <= 0:
            raise ValueError(f"flush_interval_s must be a finite number of seconds > 0, "
                             f"got {f!r}")
        if not isinstance(s.per_key_lookups, bool):
            raise ValueError(f"per_key_lookups must be true or false, got {s.per_key_lookups!r}")
        if not isinstance(s.contain_vllm_faults, bool):
            raise ValueError(f"contain_vllm_faults must be true or false, "
                             f"got {s.contain_vllm_faults!r}")
        if s.checksum_scope not in ChecksumScope.ALL_SCOPES:
            raise ValueError(f"checksum_scope must be one of {ChecksumScope.ALL_SCOPES}")
        if s.checksum_algorithm not in ALGORITHMS:
            raise ValueError(f"checksum_algorithm must be one of {sorted(ALGORITHMS)}")
        if s.checksum_threads is not None and not (isinstance(s.checksum_threads, int)
                                                   and s.checksum_threads >= 1):
            raise ValueError("checksum_threads must be an integer >= 1 (or null: automatic)")
        return s


def effective_policy(policy: str, kv_cache_config: Any,
                     extra_config: dict[str, Any] | None = None) -> str:
    """The checksum policy that can be honoured (what kvscope_info reports too)."""
    if (policy == ChecksumPolicy.REFUSE
            and load_failures.refusal_path(kv_cache_config, extra_config) is None):
        return ChecksumPolicy.OBSERVE
    return policy
