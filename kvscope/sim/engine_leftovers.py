"""What a CPU engine leaves on disk, and sweeping it when the engine never got to close.

An engine owns a temp dir (model files, the fs tier) and vLLM's ``/dev/shm`` regions
named after its engine id. ``CPUEngine.close`` removes them; a process stopped mid-run
(SIGTERM in ``kvscope demo``) calls :func:`sweep_leftovers`, which removes exactly the
engines this process opened and did not close, never another process's files.
"""

from __future__ import annotations

import glob
import os
import shutil

# Engines of this process not yet closed: key -> (temp dir, engine id).
_OPEN: dict[int, tuple[str, str]] = {}


def track(key: int, tmp: str, engine_id: str) -> None:
    """An engine was opened: its files are swept if it is never closed."""
    _OPEN[key] = (tmp, engine_id)


def close(key: int, tmp: str, engine_id: str) -> None:
    """An engine closed: remove its files and stop tracking it."""
    _remove(tmp, engine_id)
    _OPEN.pop(key, None)


def _remove(tmp: str, engine_id: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    # vLLM unlinks its /dev/shm region when the creator shuts down; a region
    # whose creator never got there (or a rank's own, "-nodeN") would stay.
    for path in glob.glob(f"/dev/shm/vllm_offload_{glob.escape(engine_id)}*.mmap"):
        try:
            os.unlink(path)
        except OSError:
            pass


def sweep_leftovers() -> int:
    """Remove the temp dirs and /dev/shm regions of engines this process did not
    close; returns how many engines that was."""
    left = list(_OPEN.items())
    for key, (tmp, engine_id) in left:
        _remove(tmp, engine_id)
        _OPEN.pop(key, None)
    return len(left)
