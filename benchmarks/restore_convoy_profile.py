"""Where the engine thread's time goes during a long restore from disk, kvscope on and off:
``restore_convoy.py``'s engine and iteration, with cProfile on the thread that steps the
engine (vLLM's scheduler thread here) for the timed re-ask only.

Reports, per arm and re-ask: the steps, the thread's profiled seconds, vLLM's prefix scans
(``_maximal_prefix_lookup``: calls, seconds, keys looked up per step) and the seconds spent in
kvscope's own functions (``connector/``, ``exporters/``), with the top of kvscope's.
cProfile slows pure-Python code several times over (vLLM's per-key lookups most), so compare
the arms with each other, never with restore_convoy.py's wall times.

    python benchmarks/restore_convoy_profile.py --tokens 131072 --out benchmarks/results/restore_convoy_131k_profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

from kvscope_switch import KvscopeSwitch
from pair_stats import abba
from restore_convoy import OUT, engine_config, evict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
OURS = ("connector" + os.sep, "exporters" + os.sep)


def report(stats: pstats.Stats, label: str, steps: int) -> list[str]:
    scan = lookups = (0, 0.0)
    ours: list[tuple[float, int, str]] = []
    for (path, line, name), (_cc, calls, tt, ct, _callers) in stats.stats.items():
        if name == "_maximal_prefix_lookup":
            scan = (calls, ct)
        elif name == "lookup" and path.endswith(os.path.join("tiering", "manager.py")):
            lookups = (calls, ct)
        rel = path[len(ROOT):] if path.startswith(ROOT) else ""
        if rel.startswith(OURS):
            ours.append((tt, calls, f"{rel}:{line}({name})"))
    ours.sort(reverse=True)
    own = sum(t for t, _, _ in ours)
    lines = [f"{label}: {steps} steps, {stats.total_tt:.2f} s profiled; vLLM's prefix scans "
             f"{scan[0]} calls {scan[1]:.2f} s, {lookups[0] / max(steps, 1):.0f} keys looked up "
             f"per step; kvscope's own functions {own:.3f} s "
             f"({100 * own / stats.total_tt:.2f} %)"]
    lines += [f"    {tt:.3f} s  {calls:>7} calls  {where}" for tt, calls, where in ours[:8]]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--out")
    a = ap.parse_args()
    from kvscope.sim.cpu_engine import CPUEngine
    from kvscope.sim.cpu_model import prompt

    lines = [f"restore_convoy_profile.py --tokens {a.tokens} (vLLM's scheduler on CPU, "
             f"{os.cpu_count()} CPUs)"]
    with CPUEngine(engine_config(a.tokens)) as e:
        switch = KvscopeSwitch(e.scheduler, [r.connector for r in e.ranks])
        e.generate(prompt(0, a.tokens), OUT, max_steps=10**6)
        for k, on in enumerate(abba(0, 2)):
            evict(e, switch, on, a.tokens, k + 1)
            prof, s0 = cProfile.Profile(), e.steps
            prof.enable()
            again = e.generate(prompt(k, a.tokens), OUT, max_steps=10**6)
            prof.disable()
            lines += report(pstats.Stats(prof), f"re-ask {k} kvscope {'on' if on else 'off'} "
                            f"(loaded {again.num_external_tokens} tokens)", e.steps - s0)
        switch.set(True)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
