"""Peak memory of one call, measured in a fresh child process.

Benchmarks that compare memory (the eigensolver against ARPACK's LU factor, kernels
against their references) need the *process* peak, which counts what C libraries allocate
(SuperLU, BLAS workspaces) and tracemalloc cannot see. Each call runs in a spawned child:
after its arguments arrive, the child resets the kernel's resident-set high-water mark
(Linux ``/proc/self/clear_refs``, value 5), runs the call, and reports VmHWM minus the
resident size it started from. Where the reset is unavailable the child falls back to
``ru_maxrss`` (which then includes the arguments) and says so.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time
import traceback
from dataclasses import dataclass
from typing import Any


@dataclass
class Measured:
    """The outcome of `measure_in_subprocess`.

    Attributes:
        result: what the call returned (must be picklable).
        seconds: wall time of the call alone, in the child.
        peak_bytes: resident memory the call added at its peak (VmHWM - start RSS).
        exact: False when the high-water mark could not be reset (peak_bytes is then the
            child's whole peak, arguments included).
    """

    result: Any
    seconds: float
    peak_bytes: int
    exact: bool


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def _child(conn) -> None:
    try:
        fn, args, kwargs = conn.recv()
        exact = _reset_peak()
        start = _status_kib("VmRSS") or 0
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds = time.perf_counter() - t0
        if exact:
            peak = ((_status_kib("VmHWM") or 0) - start) * 1024
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send(("ok", Measured(result, seconds, max(peak, 0), exact)))
    except BaseException:  # report any failure to the parent instead of dying silently
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def measure_in_subprocess(fn, *args, timeout: float | None = None, **kwargs) -> Measured:
    """Run fn(*args, **kwargs) in a spawned child; return its result, time and peak memory.

    fn must be importable (a module-level function) and its arguments picklable.

    Raises:
        RuntimeError: the call raised (the child's traceback is in the message), the child
            died, or it ran past `timeout` seconds (it is then killed).
    """
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    # the arguments travel over our own pipe, not with the process object: multiprocessing
    # keeps the read end of its start-up pipe open in the parent, so a child that dies
    # while reading a large process object would leave the parent blocked forever
    proc = ctx.Process(target=_child, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        parent.send((fn, args, kwargs))
        if not wait([parent, proc.sentinel], timeout):
            proc.kill()
            raise RuntimeError(f"{getattr(fn, '__name__', fn)} ran past {timeout} s; killed")
        status, payload = parent.recv()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        proc.join()
        raise RuntimeError(f"child running {getattr(fn, '__name__', fn)} died "
                           f"(exit code {proc.exitcode})") from None
    finally:
        parent.close()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if status == "error":
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed in the child:\n{payload}")
    return payload
