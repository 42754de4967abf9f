"""Soak: does kvscope's memory stay flat, and its telemetry exact, over an hour of mixed
traffic on vLLM's real scheduler on CPU? The run and its checks are kvscope.sim.soak's (the
CI's short version, tests/connector/test_soak_short.py, runs the same code):

    python benchmarks/soak.py [--preset full|short] [--duration-s 3720] [--fs-dir /var/tmp]
        [--out benchmarks/results/soak_cpu]

Exit 0 when every re-ask restored what the tiers held, no telemetry error, no pending gauge
after the drain, and RSS grew less than ``--max-rss-growth`` after warm-up (1: a check
failed; 2: the fs directory is tmpfs).
"""

import sys

from kvscope.sim.soak import main

if __name__ == "__main__":
    sys.exit(main())
