"""A loopback port that refuses connections while it is held."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port bound and never listened on: a connection to it is refused, and no server
    started meanwhile can be given it. (A port closed again can go to the next server bound
    to port 0: the target meant dead then answers.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
