"""The one timing harness of furnace: every measured time in the package goes through it.

What a measured figure needs, in one place (issue 12, item 2):

- `time_call`: warm-up runs that are not counted, then ``repeats`` timed samples (or as
  many as fill ``min_time_s``), each of ``number`` calls, with an optional untimed
  ``setup`` before each run (a barrier), an optional ``synchronize`` hook on both sides of
  the timed region (``torch.cuda.synchronize``: GPU work is asynchronous) and an optional
  torch thread count applied for the measurement only. It returns a `Timing` with every
  sample and their min, median and max.
- `stopwatch`: one timed region (wall and CPU seconds) for loops that keep their own
  bookkeeping per sample, such as the bytes a collective logged; `time_call` is built on it.
- `round_robin` and `time_round_robin`: several alternatives timed in rounds, one run of
  each per round, in an order that rotates from round to round, so a change in how busy
  the host is (another job starting) reaches all of them alike. `median_paired_ratio` then
  compares two of them by the median of their per-round ratios, where such a change
  cancels out.
- `torch_threads`: a block with n torch intra-op threads; the previous count is restored
  on leaving it, by an exception too, so no measurement changes the process's setting.
- `measure_in_subprocess`: the peak resident memory of one call, in a fresh spawned child
  (it counts what C libraries allocate, which tracemalloc cannot see). After its
  arguments arrive, the child resets the kernel's resident-set high-water mark (Linux
  ``/proc/self/clear_refs``, value 5), runs the call and reports VmHWM minus the resident
  size it started from. Where the reset is unavailable it falls back to ``ru_maxrss``
  (which then includes the arguments) and says so (``exact=False``).

All times are wall-clock seconds from ``time.perf_counter``. torch is imported only where
a thread count is set, so a memory child that runs SciPy code does not load it.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import resource
import statistics
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

__all__ = [
    "Lap",
    "Measured",
    "Timing",
    "measure_in_subprocess",
    "median_paired_ratio",
    "paired_ratios",
    "round_robin",
    "stopwatch",
    "time_call",
    "time_round_robin",
    "torch_threads",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """The samples of one measurement, in seconds per call.

    Attributes:
        samples: one entry per timed sample, in the order taken (warm-up runs excluded).
        warmup: untimed runs before the first sample.
        number: calls per sample (a sample is their total time divided by ``number``).
        num_threads: torch intra-op threads during the measurement (None: left as it was).
    """

    samples: tuple[float, ...]
    warmup: int = 0
    number: int = 1
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample")

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def repeats(self) -> int:
        return len(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"samples_s": list(self.samples), "min_s": self.min, "median_s": self.median,
                "max_s": self.max, "warmup": self.warmup, "number": self.number,
                "num_threads": self.num_threads}


@dataclass
class Lap:
    """What `stopwatch` measured: wall and process CPU seconds of the block (NaN inside it)."""

    seconds: float = math.nan
    cpu_seconds: float = math.nan


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run the block with ``num_threads`` torch intra-op threads, then restore the count."""
    import torch

    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _threads(num_threads: int | None) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext() if num_threads is None else torch_threads(num_threads)


@contextlib.contextmanager
def stopwatch(*, synchronize: Callable[[], object] | None = None) -> Iterator[Lap]:
    """Time the block: ``with stopwatch() as lap: ...``, then read ``lap.seconds``.

    ``synchronize`` runs before the clock starts and before it stops, outside the timed
    region's reads, so asynchronous device work is inside the figure. An exception in the
    block propagates and leaves the lap unset.
    """
    lap = Lap()
    if synchronize is not None:
        synchronize()
    # CPU clock outside the wall clock's reads, so reading it adds nothing to the wall figure
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    yield lap
    if synchronize is not None:
        synchronize()
    lap.seconds = time.perf_counter() - wall0
    lap.cpu_seconds = time.process_time() - cpu0


def time_call(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    number: int = 1,
    min_time_s: float = 0.0,
    num_threads: int | None = None,
    setup: Callable[[], object] | None = None,
    synchronize: Callable[[], object] | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed runs, then at least ``repeats`` timed samples.

    Args:
        fn: the call to time; its result is discarded.
        repeats: timed samples (at least 1).
        warmup: untimed runs first (caches, allocator, lazy initialisation).
        number: calls per sample; the sample is their total time / ``number``.
        min_time_s: keep taking samples past ``repeats`` until this long has passed since
            the first one started (a time budget: best-of over a fixed duration).
        num_threads: torch intra-op threads for the measurement, restored afterwards.
        setup: run before every run (warm-up and timed), untimed: a barrier, a reset.
        synchronize: run on both sides of every timed sample (``torch.cuda.synchronize``).

    Returns:
        The samples with their min, median and max.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if number < 1:
        raise ValueError(f"number must be >= 1, got {number}")
    if not min_time_s >= 0:
        raise ValueError(f"min_time_s must be >= 0, got {min_time_s}")
    samples: list[float] = []
    with _threads(num_threads):
        for _ in range(warmup):
            if setup is not None:
                setup()
            fn()
        deadline = time.perf_counter() + min_time_s
        while True:
            if setup is not None:
                setup()
            with stopwatch(synchronize=synchronize) as lap:
                for _ in range(number):
                    fn()
            samples.append(lap.seconds / number)
            if len(samples) >= repeats and (min_time_s == 0 or time.perf_counter() > deadline):
                break
    return Timing(tuple(samples), warmup=warmup, number=number, num_threads=num_threads)


def round_robin(
    names: Sequence[str],
    measure: Callable[[str], T],
    *,
    rounds: int,
    warmup: int = 0,
    rotate: bool = True,
    after_round: Callable[[int], object] | None = None,
) -> dict[str, list[T]]:
    """Run ``measure(name)`` once per name per round; return each name's timed values.

    Round i (warm-up rounds counted) runs the names starting at ``i % len(names)`` when
    ``rotate``, so no alternative always runs first or right after the same other one;
    with ``rotate=False`` every round runs them in the given order. The first ``warmup``
    rounds are run and discarded. ``after_round(i)`` runs after each timed round i
    (0-based, warm-up excluded), e.g. to probe the host's speed at that moment.

    ``measure`` returns whatever a run yields (seconds, or seconds with the bytes sent):
    the values are kept as they are, in round order.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if len(set(names)) != len(names):
        raise ValueError(f"names must be distinct, got {list(names)}")
    order = list(names)
    values: dict[str, list[T]] = {name: [] for name in order}
    for step in range(warmup + rounds):
        k = step % len(order) if rotate and order else 0
        for name in order[k:] + order[:k]:
            value = measure(name)
            if step >= warmup:
                values[name].append(value)
        if after_round is not None and step >= warmup:
            after_round(step - warmup)
    return values


def time_round_robin(
    fns: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    warmup: int = 0,
    rotate: bool = True,
    num_threads: int | None = None,
    setup: Callable[[], object] | None = None,
    synchronize: Callable[[], object] | None = None,
) -> dict[str, Timing]:
    """`round_robin` over plain calls: each run is one timed call of ``fns[name]``.

    ``setup`` runs untimed before every call and ``synchronize`` around it, as in
    `time_call`; ``num_threads`` holds for the whole measurement. Sample i of every
    alternative comes from the same round, so `median_paired_ratio` can pair them.
    """

    def one(name: str) -> float:
        if setup is not None:
            setup()
        with stopwatch(synchronize=synchronize) as lap:
            fns[name]()
        return lap.seconds

    with _threads(num_threads):
        samples = round_robin(list(fns), one, rounds=rounds, warmup=warmup, rotate=rotate)
    return {name: Timing(tuple(values), warmup=warmup, num_threads=num_threads)
            for name, values in samples.items()}


def _samples(x: Timing | Sequence[float]) -> Sequence[float]:
    return x.samples if isinstance(x, Timing) else x


def paired_ratios(numerator: Timing | Sequence[float],
                  denominator: Timing | Sequence[float]) -> list[float]:
    """numerator[i] / denominator[i] for each round i (both from one round-robin run)."""
    a, b = _samples(numerator), _samples(denominator)
    if len(a) != len(b):
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    return [x / y for x, y in zip(a, b)]


def median_paired_ratio(numerator: Timing | Sequence[float],
                        denominator: Timing | Sequence[float]) -> float:
    """The median over rounds of numerator / denominator taken in the same round.

    Each ratio pairs runs taken moments apart, so a change in how busy the host is cancels
    out of it, and the median drops a round that was disturbed anyway.
    """
    return float(statistics.median(paired_ratios(numerator, denominator)))


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


def _child(conn: Connection) -> None:
    try:
        fn, args, kwargs, num_threads = conn.recv()
        with _threads(num_threads):
            exact = _reset_peak()
            start = _status_kib("VmRSS") or 0
            with stopwatch() as lap:
                result = fn(*args, **kwargs)
            if exact:
                peak = ((_status_kib("VmHWM") or 0) - start) * 1024
            else:
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send(("ok", Measured(result, lap.seconds, max(peak, 0), exact)))
    except BaseException:  # report any failure to the parent instead of dying silently
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def measure_in_subprocess(fn: Callable[..., Any], *args: Any, timeout: float | None = None,
                          num_threads: int | None = None, **kwargs: Any) -> Measured:
    """Run fn(*args, **kwargs) in a spawned child; return its result, time and peak memory.

    fn must be importable (a module-level function) and its arguments picklable.
    ``num_threads`` sets the child's torch intra-op threads for the call (None: torch's
    default in a fresh process).

    Raises:
        RuntimeError: the call raised (the child's traceback is in the message), the child
            died, or it ran past `timeout` seconds (it is then killed).
    """
    from multiprocessing.connection import wait

    name = getattr(fn, "__name__", repr(fn))
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    # the arguments travel over our own pipe, not with the process object: multiprocessing
    # keeps the read end of its start-up pipe open in the parent, so a child that dies
    # while reading a large process object would leave the parent blocked forever
    proc = ctx.Process(target=_child, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        parent.send((fn, args, kwargs, num_threads))
        if not wait([parent, proc.sentinel], timeout):
            proc.kill()
            raise RuntimeError(f"{name} ran past {timeout} s; killed")
        status, payload = parent.recv()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        proc.join()
        raise RuntimeError(f"child running {name} died (exit code {proc.exitcode})") from None
    finally:
        parent.close()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
    if status == "error":
        raise RuntimeError(f"{name} failed in the child:\n{payload}")
    if not isinstance(payload, Measured):
        raise RuntimeError(f"child running {name} sent {type(payload).__name__}, not Measured")
    return payload
