"""SIGTERM as an exception: what a scheduler's plain ``kill`` sends must unwind like Ctrl-C.

Kept free of torch so that every command (the eigensolver's MPI ranks included) can use it
without importing torch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

__all__ = ["sigterm_exits"]


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` instead of killing the process.

    So ``finally`` blocks run: `run_distributed` stops and reaps its ranks, a process pool
    terminates its workers, a partial output is removed. Only the main thread can install
    a signal handler; elsewhere, and where a handler other than the default one is already
    installed, the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return

    def _exit(signum: int, frame: FrameType | None) -> NoReturn:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
