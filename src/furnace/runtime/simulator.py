"""Discrete-event list scheduling of tasks on resources.

This module implements a small, dependency-free discrete-event engine: tasks with durations
and dependencies are list-scheduled onto capacity-limited resources (compute streams, network
links, ...), and the resulting :class:`Timeline` reports the makespan, the critical path, per
resource utilization and a Chrome trace (viewable in Perfetto or chrome://tracing).

Why it exists: the systems in furnace need to say how a distributed training step (for example
an MoE layer step with compute streams and network links) behaves at 16 to 1024 GPUs, which
we cannot run. They measure the per-task costs at a scale we can run (with emulated links),
validate the projection against those measurements, and then use this engine to project the
step to larger scales. Keeping it stdlib-only lets it run anywhere, including in CI without
a GPU.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text

__all__ = ["Resource", "ScheduledTask", "Simulator", "Task", "Timeline"]

# Row name for tasks that need no resource (pure delays) in traces.
NO_RESOURCE_ROW = "(no resource)"

# Relative tolerance when matching an end time to a start time on the critical path: times
# reached through different sums of durations can differ in the last bits.
_REL_TOL = 1e-12


def _same_time(a: float, b: float) -> bool:
    return abs(a - b) <= _REL_TOL * max(abs(a), abs(b))


@dataclass(frozen=True)
class Resource:
    """Something tasks occupy while they run, e.g. a compute stream or a network link.

    ``capacity`` is how many tasks may run on it at the same time.
    """

    name: str
    capacity: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"resource name must be a non-empty string, got {self.name!r}")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            raise ValueError(
                f"resource {self.name!r}: capacity must be an int, got {self.capacity!r}"
            )
        if self.capacity < 1:
            raise ValueError(f"resource {self.name!r}: capacity must be >= 1, got {self.capacity}")


@dataclass(frozen=True)
class Task:
    """A unit of work: ``duration`` seconds on ``resource`` after all ``deps`` have ended.

    ``resource`` None means the task needs no resource (a pure delay). ``category`` is free-form
    (e.g. "compute", "comm") and only used to group tasks in traces and breakdowns.
    """

    name: str
    duration: float
    resource: str | None = None
    deps: tuple[str, ...] = ()
    category: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"task name must be a non-empty string, got {self.name!r}")
        try:
            duration = float(self.duration)
        except (TypeError, ValueError):
            raise ValueError(
                f"task {self.name!r}: duration must be a number, got {self.duration!r}"
            ) from None
        if not math.isfinite(duration) or duration < 0:
            raise ValueError(
                f"task {self.name!r}: duration must be finite and >= 0, got {duration}"
            )
        # A bare string is almost always meant as a single dependency, not a tuple of characters.
        deps = (self.deps,) if isinstance(self.deps, str) else tuple(self.deps)
        for dep in deps:
            if not isinstance(dep, str):
                raise ValueError(f"task {self.name!r}: dependency names must be str, got {dep!r}")
        object.__setattr__(self, "duration", duration)
        object.__setattr__(self, "deps", deps)


@dataclass(frozen=True)
class ScheduledTask:
    """A task with the interval ``[start, end)`` it was scheduled into (seconds)."""

    task: Task
    start: float
    end: float

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def resource(self) -> str | None:
        return self.task.resource

    @property
    def duration(self) -> float:
        return self.end - self.start


class Simulator:
    """Event-driven list scheduler of tasks on capacity-limited resources.

    Semantics:

    * A task is *ready* when all its dependencies have ended (tasks without dependencies are
      ready at time 0).
    * A task without a resource starts as soon as it is ready.
    * Each resource serves its ready tasks FIFO by ready time; ties are broken by the order in
      which the tasks were added, so a run is fully deterministic. A task starts at
      ``max(ready time, time a resource slot frees)``; it never waits while a slot is free.
    * Slots of a resource are numbered ``0 .. capacity - 1``; a starting task takes the lowest
      free slot (only visible in traces and critical-path attribution).
    * Zero-duration tasks are allowed: they take a slot for no time and their dependents become
      ready at the same instant. Tasks made ready at an instant by such a zero-duration chain
      queue behind tasks that already started at that instant.

    The engine keeps a heap of task-end events and a per-resource heap of ready tasks, so a run
    costs O((tasks + edges) log tasks).
    """

    def __init__(self, resources: Iterable[Resource] = ()) -> None:
        self._resources: dict[str, Resource] = {}
        self._tasks: list[Task] = []
        self._index: dict[str, int] = {}
        for resource in resources:
            self.add_resource(resource)

    @property
    def resources(self) -> dict[str, Resource]:
        return dict(self._resources)

    @property
    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def add_resource(self, resource: Resource | str, capacity: int = 1) -> Resource:
        """Register a resource (a :class:`Resource`, or a name plus ``capacity``)."""
        if isinstance(resource, str):
            resource = Resource(resource, capacity)
        elif not isinstance(resource, Resource):
            raise ValueError(f"expected a Resource or a name, got {resource!r}")
        if resource.name in self._resources:
            raise ValueError(f"duplicate resource {resource.name!r}")
        self._resources[resource.name] = resource
        return resource

    def add_task(
        self,
        name: str,
        duration: float,
        *,
        resource: str | None = None,
        deps: Iterable[str] = (),
        category: str = "",
    ) -> Task:
        """Create and add a task; see :class:`Task` for the fields."""
        deps = (deps,) if isinstance(deps, str) else tuple(deps)
        return self.add(
            Task(name=name, duration=duration, resource=resource, deps=deps, category=category)
        )

    def add(self, task: Task) -> Task:
        """Add an existing :class:`Task`. Dependencies may name tasks added later."""
        if not isinstance(task, Task):
            raise ValueError(f"expected a Task, got {task!r}")
        if task.name in self._index:
            raise ValueError(f"duplicate task name {task.name!r}")
        self._index[task.name] = len(self._tasks)
        self._tasks.append(task)
        return task

    def _validate(self) -> tuple[list[list[int]], list[list[int]]]:
        """Check references and acyclicity; return (deps, successors) as index lists."""
        tasks = self._tasks
        index = self._index
        dep_idx: list[list[int]] = []
        succ: list[list[int]] = [[] for _ in tasks]
        for i, task in enumerate(tasks):
            if task.resource is not None and task.resource not in self._resources:
                raise ValueError(
                    f"task {task.name!r} uses unknown resource {task.resource!r} "
                    f"(known: {sorted(self._resources)})"
                )
            seen: set[int] = set()
            ds: list[int] = []
            for dep in task.deps:
                j = index.get(dep)
                if j is None:
                    raise ValueError(f"task {task.name!r} depends on unknown task {dep!r}")
                # Repeated names would otherwise be counted twice against one end event.
                if j not in seen:
                    seen.add(j)
                    ds.append(j)
                    succ[j].append(i)
            dep_idx.append(ds)

        pending = [len(ds) for ds in dep_idx]
        stack = [i for i, n in enumerate(pending) if n == 0]
        done = 0
        while stack:
            i = stack.pop()
            done += 1
            for s in succ[i]:
                pending[s] -= 1
                if pending[s] == 0:
                    stack.append(s)
        if done != len(tasks):
            raise ValueError(f"dependency cycle: {' -> '.join(self._find_cycle(dep_idx, pending))}")
        return dep_idx, succ

    def _find_cycle(self, dep_idx: list[list[int]], pending: list[int]) -> list[str]:
        # Every task left unresolved by Kahn's pass has an unresolved dependency, so following
        # those from any of them must revisit a task; the revisited stretch is a cycle.
        start = next(i for i, n in enumerate(pending) if n > 0)
        order: list[int] = []
        pos: dict[int, int] = {}
        i = start
        while i not in pos:
            pos[i] = len(order)
            order.append(i)
            i = next(j for j in dep_idx[i] if pending[j] > 0)
        cycle = order[pos[i] :]
        # Walked along deps (backwards in time); report in execution order, closing the loop.
        cycle.reverse()
        names = [self._tasks[j].name for j in cycle]
        return [*names, names[0]]

    def run(self) -> Timeline:
        """Schedule all tasks and return the resulting :class:`Timeline`."""
        dep_idx, succ = self._validate()
        tasks = self._tasks
        n = len(tasks)
        res_names = list(self._resources)
        res_pos = {name: k for k, name in enumerate(res_names)}
        task_res = [-1 if t.resource is None else res_pos[t.resource] for t in tasks]
        durations = [t.duration for t in tasks]

        start = [0.0] * n
        end = [0.0] * n
        ready = [0.0] * n
        slot_of = [-1] * n
        prev_on_slot = [-1] * n
        pending = [len(ds) for ds in dep_idx]

        queues: list[list[tuple[float, int]]] = [[] for _ in res_names]
        free_slots = [list(range(self._resources[r].capacity)) for r in res_names]
        last_on_slot = [[-1] * self._resources[r].capacity for r in res_names]
        events: list[tuple[float, int]] = []
        dirty: set[int] = set()

        def make_ready(i: int, t: float) -> None:
            ready[i] = t
            r = task_res[i]
            if r < 0:
                start[i] = t
                end[i] = t + durations[i]
                heapq.heappush(events, (end[i], i))
            else:
                heapq.heappush(queues[r], (t, i))
                dirty.add(r)

        for i in range(n):
            if pending[i] == 0:
                make_ready(i, 0.0)

        now = 0.0
        while True:
            # Sorted so that end events are pushed in a reproducible order.
            for r in sorted(dirty):
                queue = queues[r]
                free = free_slots[r]
                while queue and free:
                    _, i = heapq.heappop(queue)
                    slot = heapq.heappop(free)
                    start[i] = now
                    end[i] = now + durations[i]
                    slot_of[i] = slot
                    prev_on_slot[i] = last_on_slot[r][slot]
                    last_on_slot[r][slot] = i
                    heapq.heappush(events, (end[i], i))
            dirty.clear()
            if not events:
                break
            # Drain every end at this instant before dispatching, so that all tasks made ready
            # at the same time compete by insertion order rather than by event order.
            now = events[0][0]
            while events and events[0][0] == now:
                _, i = heapq.heappop(events)
                r = task_res[i]
                if r >= 0:
                    heapq.heappush(free_slots[r], slot_of[i])
                    dirty.add(r)
                for s in succ[i]:
                    pending[s] -= 1
                    if pending[s] == 0:
                        make_ready(s, now)

        scheduled = [ScheduledTask(t, start[i], end[i]) for i, t in enumerate(tasks)]
        return Timeline(
            scheduled,
            self._resources.values(),
            ready_times=ready,
            slots=slot_of,
            slot_predecessors=[tasks[j].name if j >= 0 else None for j in prev_on_slot],
        )


class Timeline:
    """The result of a run: every task with its start and end, in the order tasks were added.

    A Timeline can also be built directly from scheduled tasks (e.g. measured ones); then ready
    times, slots and slot predecessors are derived from the intervals.
    """

    def __init__(
        self,
        scheduled: Iterable[ScheduledTask],
        resources: Iterable[Resource] | Mapping[str, Resource] = (),
        *,
        ready_times: Sequence[float] | None = None,
        slots: Sequence[int] | None = None,
        slot_predecessors: Sequence[str | None] | None = None,
    ) -> None:
        self.tasks: list[ScheduledTask] = list(scheduled)
        if isinstance(resources, Mapping):
            resources = resources.values()
        self.resources: dict[str, Resource] = {r.name: r for r in resources}
        self._by_name: dict[str, ScheduledTask] = {}
        for st in self.tasks:
            if st.name in self._by_name:
                raise ValueError(f"duplicate task name {st.name!r}")
            self._by_name[st.name] = st
        self._pos = {st.name: k for k, st in enumerate(self.tasks)}
        self.makespan: float = max((st.end for st in self.tasks), default=0.0)

        if ready_times is None:
            ready_times = [
                max((self._by_name[d].end for d in st.task.deps if d in self._by_name), default=0.0)
                for st in self.tasks
            ]
        self._ready = list(ready_times)
        if slots is None or slot_predecessors is None:
            slots, slot_predecessors = self._assign_slots()
        self._slots = list(slots)
        self._slot_pred = list(slot_predecessors)

    def _assign_slots(self) -> tuple[list[int], list[str | None]]:
        # Greedy interval partitioning by start time; lowest free slot first, as the simulator.
        slots = [-1] * len(self.tasks)
        preds: list[str | None] = [None] * len(self.tasks)
        groups: dict[str, list[int]] = {}
        for k, st in enumerate(self.tasks):
            if st.resource is not None:
                groups.setdefault(st.resource, []).append(k)
        for members in groups.values():
            members.sort(key=lambda k: (self.tasks[k].start, k))
            busy: list[tuple[float, int]] = []  # (end, slot)
            free: list[int] = []
            last: list[int] = []
            for k in members:
                st = self.tasks[k]
                while busy and busy[0][0] <= st.start:
                    heapq.heappush(free, heapq.heappop(busy)[1])
                if free:
                    slot = heapq.heappop(free)
                else:
                    slot = len(last)
                    last.append(-1)
                slots[k] = slot
                if last[slot] >= 0:
                    preds[k] = self.tasks[last[slot]].name
                last[slot] = k
                heapq.heappush(busy, (st.end, slot))
        return slots, preds

    def __getitem__(self, name: str) -> ScheduledTask:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no task named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[ScheduledTask]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def ready_time(self, name: str) -> float:
        """When ``name`` had all its dependencies ended (its wait = start - ready time)."""
        return self._ready[self._pos[name]]

    def slot(self, name: str) -> int:
        """Which slot of its resource ``name`` ran in (-1 for tasks without a resource)."""
        return self._slots[self._pos[name]]

    def critical_path(self) -> list[ScheduledTask]:
        """The chain of tasks that determines the makespan, in time order.

        Walk back from the task that ends last. The predecessor of a task is the dependency that
        ended exactly at its start or, failing that, the task that previously occupied the
        resource slot it took, if that one ended exactly at its start (the task waited for it).
        The walk stops at a task that started at time 0 or that nothing held back.
        """
        if not self.tasks:
            return []
        # Among equal ends prefer the later start: a zero-duration tail is downstream of its
        # dependency, and the path should reach it.
        k = max(range(len(self.tasks)), key=lambda j: (self.tasks[j].end, self.tasks[j].start, j))
        path = [self.tasks[k]]
        while True:
            cur = self.tasks[k]
            if cur.start == 0.0:
                break
            nxt = None
            for dep in cur.task.deps:
                st = self._by_name.get(dep)
                if st is not None and _same_time(st.end, cur.start):
                    nxt = self._pos[dep]
                    break
            if nxt is None:
                pred = self._slot_pred[k]
                if pred is not None and _same_time(self._by_name[pred].end, cur.start):
                    nxt = self._pos[pred]
            if nxt is None:
                break
            k = nxt
            path.append(self.tasks[k])
        path.reverse()
        return path

    def by_resource(self) -> dict[str, list[ScheduledTask]]:
        """Tasks per resource, sorted by start (ties by insertion order).

        Every known resource has an entry, even if idle; tasks without a resource are left out.
        """
        out: dict[str, list[ScheduledTask]] = {name: [] for name in self.resources}
        for st in self.tasks:
            if st.resource is not None:
                out.setdefault(st.resource, []).append(st)
        for members in out.values():
            members.sort(key=lambda st: (st.start, self._pos[st.name]))
        return out

    def _check_resource(self, resource: str) -> None:
        if resource not in self.resources and not any(st.resource == resource for st in self.tasks):
            raise KeyError(f"unknown resource {resource!r}")

    def busy_time(self, resource: str) -> float:
        """Summed task durations on ``resource`` (slot-seconds for capacity > 1)."""
        self._check_resource(resource)
        return math.fsum(st.end - st.start for st in self.tasks if st.resource == resource)

    def utilization(self, resource: str) -> float:
        """``busy_time / makespan / capacity``; 0 for an empty or zero-length timeline."""
        busy = self.busy_time(resource)
        if self.makespan <= 0:
            return 0.0
        capacity = self.resources[resource].capacity if resource in self.resources else 1
        return busy / self.makespan / capacity

    def category_totals(self) -> dict[str, float]:
        """Summed task durations per category, in order of first appearance."""
        parts: dict[str, list[float]] = {}
        for st in self.tasks:
            parts.setdefault(st.task.category, []).append(st.end - st.start)
        return {cat: math.fsum(values) for cat, values in parts.items()}

    def _trace_rows(self) -> tuple[list[tuple[int, str]], list[int]]:
        """Assign a trace row (tid) to every task; return (rows, tid per task)."""
        rows: list[tuple[int, str]] = []
        tid_of = [0] * len(self.tasks)
        row_key: dict[tuple[str, int], int] = {}
        used_slots: dict[str, int] = {}
        for k, st in enumerate(self.tasks):
            if st.resource is not None:
                used_slots[st.resource] = max(used_slots.get(st.resource, 0), self._slots[k] + 1)
        names = list(self.resources) + [r for r in used_slots if r not in self.resources]
        for name in names:
            capacity = self.resources[name].capacity if name in self.resources else 0
            count = max(1, used_slots.get(name, 0))
            for slot in range(count):
                label = name if max(capacity, count) == 1 else f"{name} [{slot}]"
                row_key[(name, slot)] = len(rows)
                rows.append((len(rows), label))
        for k, st in enumerate(self.tasks):
            if st.resource is not None:
                tid_of[k] = row_key[(st.resource, self._slots[k])]

        # Delays have no slots; give overlapping ones separate lanes so that bars stay
        # properly nested (chrome://tracing rejects overlapping slices on one thread).
        delays = sorted(
            (k for k, st in enumerate(self.tasks) if st.resource is None),
            key=lambda k: (self.tasks[k].start, k),
        )
        busy: list[tuple[float, int]] = []
        free: list[int] = []
        lanes: list[int] = []
        for k in delays:
            st = self.tasks[k]
            while busy and busy[0][0] <= st.start:
                heapq.heappush(free, heapq.heappop(busy)[1])
            if free:
                lane = heapq.heappop(free)
            else:
                lane = len(lanes)
                label = NO_RESOURCE_ROW if lane == 0 else f"{NO_RESOURCE_ROW} [{lane}]"
                lanes.append(len(rows))
                rows.append((len(rows), label))
            tid_of[k] = lanes[lane]
            heapq.heappush(busy, (st.end, lane))
        return rows, tid_of

    def to_chrome_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Chrome Trace Event Format dict (times in microseconds); written to ``path`` if given.

        One row (tid) per resource slot, so tasks sharing a capacity > 1 resource do not draw
        on top of each other; tasks without a resource go on the "(no resource)" row.
        """
        rows, tid_of = self._trace_rows()
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "furnace"}}
        ]
        for tid, label in rows:
            events.append(
                {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": label}}
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": 0,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        order = sorted(range(len(self.tasks)), key=lambda k: (self.tasks[k].start, k))
        for k in order:
            st = self.tasks[k]
            events.append(
                {
                    "name": st.name,
                    "cat": st.task.category or "task",
                    "ph": "X",
                    "ts": st.start * 1e6,
                    "dur": (st.end - st.start) * 1e6,
                    "pid": 0,
                    "tid": tid_of[k],
                    "args": {
                        "category": st.task.category,
                        "deps": list(st.task.deps),
                        "resource": st.resource,
                    },
                }
            )
        trace = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is not None:
            out = Path(path)
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out, json.dumps(trace, indent=1) + "\n", encoding="ascii")
        return trace

    def summary(self) -> str:
        """A short human-readable report: makespan, critical path and utilization."""
        lines = [f"makespan: {self.makespan:.6g} s over {len(self.tasks)} tasks"]
        path = self.critical_path()
        names = [st.name for st in path]
        if len(names) > 12:
            names = [*names[:6], f"... ({len(names) - 12} more) ...", *names[-6:]]
        lines.append(f"critical path ({len(path)} tasks): {' -> '.join(names) or '(empty)'}")
        if self.resources:
            lines.append("utilization:")
            width = max(len(name) for name in self.resources)
            for name, resource in self.resources.items():
                lines.append(
                    f"  {name:<{width}}  {100 * self.utilization(name):6.2f}%"
                    f"  busy {self.busy_time(name):.6g} s  capacity {resource.capacity}"
                )
        return "\n".join(lines)
