"""Files kv-diagnose writes (bundles, plots) appear whole or not at all.

A fresh temporary file beside the target (``mkstemp``: ``O_EXCL``, never through
a symlink), written, then renamed over the target; on failure it is removed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from .model import DiagnoseError


def write_atomically(path: str, what: str, write: Callable[[BinaryIO], None],
                     suffix: str = ".tmp") -> None:
    """Call ``write`` on a temp file beside ``path``, then rename it to ``path``.
    ``what`` names the file in the one-line error (``cannot write <what> <path>: ...``)."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=suffix)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            write(f)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise DiagnoseError(f"cannot write {what} {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
