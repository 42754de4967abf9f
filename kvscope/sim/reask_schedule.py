"""Which prompt a restore benchmark asks to evict, and which it re-asks and times, per
iteration (the GPU benchmark gpu_scale.py, and restore_convoy.py on CPU).

Each timed re-ask must find its prompt on disk only: gone from the GPU blocks and from the
primary tier (both hold about one prompt), its chunks in the fs tier. Two ways to get there:

- ``prefill`` (every run before 2026-12-05): prompt k+1 is asked first, untimed; its
  prefill evicts prompt k and its chunks cascade to disk. Then prompt k is re-asked. An
  iteration pays a long prefill and its cascades besides the restore.
- ``restore``: prompts 0, 1 and 2 are asked once, then re-asked in turn. Each re-ask's
  promotions evict the oldest rows of the primary tier and its load the oldest free blocks
  of the GPU, and every prompt's chunks stay on disk, so each re-ask is a restore from disk
  with no prefill before it: about half an iteration's time at 131k, more pairs per minute
  of GPU time. Three prompts, not two: the rows and GPU blocks to spare beyond one prompt
  (gpu_scale: 800 rows and 64 blocks) keep part of the prompt restored before the last, so
  with two each re-ask found part of its prefix still there (vLLM's scheduler on CPU, 32k
  tokens: 1,668 keys promoted and 31,776 tokens loaded of 2,048 and 32,768); two restores
  in between leave none. The fs files are read again and again, so the fs tier must not be
  pruned.
"""

from __future__ import annotations

import os

BETWEEN = ("prefill", "restore")
ROTATION = 3  # prompts re-asked in turn with ``restore`` (why three: the docstring)


def _check(between: str) -> None:
    if between not in BETWEEN:
        raise ValueError(f"between must be one of {BETWEEN}, not {between!r}")


def first_asks(between: str) -> tuple[int, ...]:
    """The prompts asked once, in order, before the first iteration (their outputs are what
    each re-ask's output must equal)."""
    _check(between)
    return (0,) if between == "prefill" else tuple(range(ROTATION))


def iteration(between: str, k: int) -> tuple[int | None, int]:
    """(the prompt asked untimed first, to evict the timed one; None: none), the prompt
    re-asked and timed) of iteration ``k`` (0-based, warm-up included)."""
    _check(between)
    if between == "prefill":
        return k + 1, k
    return None, k % ROTATION


def asked_again(between: str) -> bool:
    """Whether a timed prompt is re-asked in a later iteration (``restore``): if not, its
    first output can be dropped after its re-ask, and with ``prefill`` its fs files too."""
    _check(between)
    return between == "restore"


def refuse_pruning(between: str) -> None:
    """Exit if the schedule re-asks a prompt later: pruning would remove what it reads."""
    if asked_again(between):
        raise SystemExit("--prune-fs removes the files the next re-asks read (--between restore)")


def prune(root: str, before: float) -> int:
    """Remove the fs tier's block files written before ``before`` (wall clock): prompts not
    asked again. vLLM's fs tier looks a key up by its file's existence and keeps no index,
    so nothing refers to them; with 512 KiB blocks (1b) a 131k prompt is 4 GiB of tmpfs."""
    n = 0
    for path, _, files in os.walk(root):
        for name in files:
            if name.endswith(".bin"):
                f = os.path.join(path, name)
                try:
                    if os.stat(f).st_mtime < before:
                        os.unlink(f)
                        n += 1
                except FileNotFoundError:
                    pass
    return n
