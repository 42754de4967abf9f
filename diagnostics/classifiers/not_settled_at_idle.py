"""Not settled at idle: an engine with nothing to do that still holds GPU KV blocks, or
whose host keeps losing memory.

Once its last request has finished and no load or store job is in flight, vLLM's GPU
block pool holds nothing: every block is free (prefix-cached blocks too: any request may
take them). kvscope reads the pool at the end of each step that leaves the engine so
(``kvscope_idle_gpu_blocks_in_use``). Blocks still in use then are held by no request, and
nothing will free them before a restart: something (a connector, a scheduler change, a
plugin) took a reference and never released it. Every later request has that much less
KV cache: more preemptions and queueing, with nothing failing.

The host side of the same fault: the host's available memory falling, and still falling,
while nothing runs or waits (``kvscope_host_memory_available_bytes``); the engine
process's resident memory (``kvscope_process_resident_memory_bytes``) says whether the
memory goes to the engine or elsewhere on the host.

The series are optional: a kvscope older than them exports none (nothing here can hold
then), a host without /proc none of the memory pair. With one series of a pair there, the
other missing was dropped: "could not check".
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.exporters import signals as S

from ..evidence.build import Evidence
from ..model import Facts, Finding, Mark, Quantity
from ..thresholds import Thresholds
from ._common import n, nbytes, persistently_positive, secs
from .pending_at_idle import idle_line

ID = "not_settled_at_idle"
TITLE = "The engine did not settle at idle"
SEVERITY = 60
CHECK = ("GPU KV blocks held, or host memory falling, while nothing runs or waits (not settled "
         "at idle; where the engine exports kvscope's block-pool and host-memory series)")
# A leak explains none of the restore path's invariants
EXPLAINS: frozenset[str] = frozenset()

_BLOCKS = (S.IDLE_GPU_BLOCKS, S.GPU_BLOCKS)
_MEMORY = (S.HOST_MEMORY_AVAILABLE, S.PROCESS_RESIDENT_MEMORY)
_IDLE = (S.REQUESTS_IN_FLIGHT, S.REQUESTS)


def needs(ev: Evidence) -> tuple:
    """Each pair is exported together (the block pool's from the scheduler's start, the
    memory's wherever /proc has them): with one of a pair there, the other was dropped."""
    out: list = []
    for pair in (_BLOCKS, _MEMORY):
        if any(ev.has(m) for m in pair):
            out.extend(pair)
    return (*out, *_IDLE) if out else ()


def _idle_since(ev: Evidence) -> float:
    """Start of the window's trailing stretch in which nothing ran or waited (kvscope's
    request gauges and, where present, vLLM's): the first sample after the last busy one."""
    r = ev.requests
    busy = [r.in_flight, *r.states.values(), r.vllm_running, r.vllm_waiting]
    last_busy = max((t for q in busy if q.present for t, v in q.samples if v > 0),
                    default=None)
    if last_busy is None:
        return ev.source.start
    times = sorted({t for q in busy if q.present for t, _ in q.samples if t > last_busy})
    return times[0] if times else ev.source.end + 1


def _falling(q: Quantity, since: float, drop_min: float) -> tuple[Quantity, float] | None:
    """The samples from ``since`` on, when they fell by ``drop_min`` and kept falling (the
    later half all below the earlier half); with their drop."""
    smp = [(t, v) for t, v in q.samples if t >= since]
    if len(smp) < 3:
        return None
    half = len(smp) // 2
    drop = smp[0][1] - smp[-1][1]
    if drop < drop_min or max(v for _, v in smp[half:]) >= min(v for _, v in smp[:half]):
        return None
    return Quantity(first=smp[0][1], last=smp[-1][1], samples=tuple(smp), present=True), drop


@dataclass(frozen=True)
class HeldBlocks:
    """GPU KV blocks held by no request at the end of the latest idle step."""

    held: float  # kvscope_idle_gpu_blocks_in_use, latest
    total: float | None  # the pool's blocks; None: not exported
    in_use_now: float | None  # vLLM's block pool now; None: not exported
    held_first: float
    grew_by: float  # over the window

    def lines(self) -> list[str]:
        of = f" of {n(self.total)}" if self.total is not None and self.total > 0 else ""
        lines = [f"{n(self.held)}{of} GPU KV blocks still in use at the end of the latest step "
                 f"that left nothing in flight ({S.IDLE_GPU_BLOCKS.name}): no request holds "
                 "them, and nothing frees them before a restart"]
        if self.in_use_now is not None:
            lines.append(f"vLLM's block pool now: {n(self.in_use_now)} blocks in use "
                         f'({S.GPU_BLOCKS.name}{{state="{S.GpuBlockState.IN_USE.value}"}})')
        if self.grew_by > 0:
            lines.append(f"held at idle grew by {n(self.grew_by)} in the window "
                         f"({n(self.held_first)} → {n(self.held)}): each burst of requests "
                         "leaves more behind")
        return lines


@dataclass(frozen=True)
class FallingMemory:
    """The host's available memory falling while idle, and the engine process's share."""

    dropped_bytes: float
    from_bytes: float
    to_bytes: float
    over_s: float
    threshold_bytes: float
    process_grew_bytes: float | None  # the engine's resident memory meanwhile; None: unknown

    @property
    def own(self) -> bool:
        """The engine process grew by at least half the drop: the memory goes to it."""
        return self.process_grew_bytes is not None and self.process_grew_bytes >= self.dropped_bytes / 2

    def lines(self) -> list[str]:
        lines = [f"the host's available memory fell by {nbytes(self.dropped_bytes)} "
                 f"({nbytes(self.from_bytes)} → {nbytes(self.to_bytes)}) over {secs(self.over_s)} "
                 f"while nothing ran or waited, and kept falling ({S.HOST_MEMORY_AVAILABLE.name}; "
                 f"threshold {nbytes(self.threshold_bytes)})"]
        grew = self.process_grew_bytes
        if grew is not None and self.own:
            lines.append(f"the engine process grew by {nbytes(grew)} meanwhile "
                         f"({S.PROCESS_RESIDENT_MEMORY.name}): the memory goes to it")
        elif grew is not None:
            lines.append(f"the engine process's resident memory changed by {nbytes(grew)} "
                         f"meanwhile ({S.PROCESS_RESIDENT_MEMORY.name}): the memory goes "
                         "elsewhere on the host (another process, /dev/shm, the kernel)")
        return lines


@dataclass(frozen=True)
class NotSettledFacts(Facts):
    blocks: HeldBlocks | None  # None: no GPU block held at idle
    memory: FallingMemory | None  # None: the host's memory did not keep falling
    vllm_running: float | None  # vLLM's own gauges; None: not exported
    vllm_waiting: float | None

    def lines(self) -> list[str]:
        return [*(self.blocks.lines() if self.blocks else []),
                *(self.memory.lines() if self.memory else []),
                idle_line(self.vllm_running, self.vllm_waiting)]


def _blocks(ev: Evidence) -> tuple[HeldBlocks | None, list[Mark]]:
    st = ev.settling
    held = st.idle_gpu_blocks
    if not persistently_positive(held, ev):
        return None, []
    total = st.blocks(S.GpuBlockState.TOTAL)
    now = st.blocks(S.GpuBlockState.IN_USE)
    facts = HeldBlocks(held=held.last, total=total.last if total.present else None,
                       in_use_now=now.last if now.present else None,
                       held_first=held.first, grew_by=held.increase)
    t = next((t for t, v in held.samples if v > 0), ev.source.end)
    return facts, [Mark("settling", t, "GPU blocks held at idle")]


def _memory(ev: Evidence, th: Thresholds) -> tuple[FallingMemory | None, list[Mark]]:
    st = ev.settling
    since = _idle_since(ev)
    fell = _falling(st.host_available, since, th.idle_memory_drop_bytes) \
        if st.host_available.present else None
    if fell is None:
        return None, []
    avail, drop = fell
    rss = [(t, v) for t, v in st.process_resident.samples if t >= avail.samples[0][0]]
    facts = FallingMemory(
        dropped_bytes=drop, from_bytes=avail.first, to_bytes=avail.last,
        over_s=avail.samples[-1][0] - avail.samples[0][0],
        threshold_bytes=th.idle_memory_drop_bytes,
        process_grew_bytes=rss[-1][1] - rss[0][1] if len(rss) >= 2 else None)
    return facts, [Mark("host_memory", avail.samples[0][0], "memory falling at idle")]


def classify(ev: Evidence, th: Thresholds) -> Finding | None:
    if not ev.idle:
        return None
    held, marks = _blocks(ev)
    mem, mem_marks = _memory(ev, th)
    if held is None and mem is None:
        return None
    r = ev.requests
    own = mem is not None and mem.own
    facts = NotSettledFacts(
        blocks=held, memory=mem,
        vllm_running=r.vllm_running.last if r.vllm_running.present else None,
        vllm_waiting=r.vllm_waiting.last if r.vllm_waiting.present else None)
    steps = []
    if held is not None:
        steps.append(
            "Capture the evidence (kv-diagnose record ... -o idle.kvb), then restart the engine "
            "at a quiet moment: held blocks come back only with a restart. Find who keeps the "
            "references: a KV connector, plugin or scheduler change that pins a request's "
            "blocks and never frees them (run the stock OffloadingConnector beside it to tell "
            "kvscope's connector apart); file an issue with the bundle and the vLLM version.")
    if mem is not None:
        steps.append(
            "On the host: the engine process's memory over time (a leak in the engine: a Python "
            "heap or allocator profile, then a restart at a quiet moment)." if own else
            "On the host: find what grows (ps by RSS, ls -l /dev/shm, slabtop): another process "
            "or shared memory, not the engine process.")
    sub = " (GPU blocks held)" if mem is None else (" (host memory falling)" if held is None else "")
    return Finding(
        id=ID,
        title=TITLE + sub,
        confidence=0.85 if held is not None or own else 0.55,
        facts=facts,
        next_step=" ".join(steps),
        severity=SEVERITY,
        marks=marks + mem_marks,
        uses_gauges=True,
    )
