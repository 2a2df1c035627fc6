"""Tests for the discrete-event simulator (furnace.runtime.simulator)."""

from __future__ import annotations

import json
import random
from itertools import pairwise

import pytest

from furnace.runtime.simulator import Resource, ScheduledTask, Simulator, Task, Timeline

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


def names(path: list[ScheduledTask]) -> list[str]:
    return [st.name for st in path]


@pytest.mark.timeout(30)
def test_chain_on_one_resource() -> None:
    sim = Simulator([Resource("gpu")])
    sim.add_task("A", 2.0, resource="gpu")
    sim.add_task("B", 3.0, resource="gpu", deps=("A",))
    sim.add_task("C", 1.0, resource="gpu", deps=("B",))
    tl = sim.run()
    # A [0,2], B [2,5], C [5,6]
    assert tl.makespan == 6.0
    assert (tl["B"].start, tl["B"].end) == (2.0, 5.0)
    assert names(tl.critical_path()) == ["A", "B", "C"]
    assert [st.name for st in tl] == ["A", "B", "C"]


@pytest.mark.timeout(30)
def test_capacity_serializes_or_parallelizes() -> None:
    one = Simulator([Resource("link", capacity=1)])
    one.add_task("a", 2.0, resource="link")
    one.add_task("b", 3.0, resource="link")
    tl1 = one.run()
    # capacity 1: a [0,2], b [2,5] -> makespan 2 + 3 = 5
    assert tl1.makespan == 5.0
    assert tl1["b"].start == 2.0
    assert names(tl1.critical_path()) == ["a", "b"]

    two = Simulator([Resource("link", capacity=2)])
    two.add_task("a", 2.0, resource="link")
    two.add_task("b", 3.0, resource="link")
    tl2 = two.run()
    # capacity 2: both start at 0 -> makespan max(2, 3) = 3
    assert tl2.makespan == 3.0
    assert tl2["a"].start == tl2["b"].start == 0.0
    assert names(tl2.critical_path()) == ["b"]


@pytest.mark.timeout(30)
def test_diamond_takes_longer_branch() -> None:
    sim = Simulator([Resource("s0"), Resource("s1")])
    sim.add_task("A", 1.0, resource="s0")
    sim.add_task("B", 4.0, resource="s0", deps=("A",))
    sim.add_task("C", 2.0, resource="s1", deps=("A",))
    sim.add_task("D", 1.0, resource="s0", deps=("B", "C"))
    tl = sim.run()
    # A [0,1]; B [1,5] and C [1,3] in parallel; D waits for B: [5,6]
    assert tl.makespan == 6.0
    assert tl.ready_time("D") == 5.0
    assert names(tl.critical_path()) == ["A", "B", "D"]

    # Swap the branch lengths: the path now goes through C. A [0,1], B [1,2], C [1,5], D [5,6]
    sim2 = Simulator([Resource("s0"), Resource("s1")])
    sim2.add_task("A", 1.0, resource="s0")
    sim2.add_task("B", 1.0, resource="s0", deps=("A",))
    sim2.add_task("C", 4.0, resource="s1", deps=("A",))
    sim2.add_task("D", 1.0, resource="s0", deps=("B", "C"))
    tl2 = sim2.run()
    assert tl2.makespan == 6.0
    assert names(tl2.critical_path()) == ["A", "C", "D"]


@pytest.mark.timeout(30)
def test_resource_contention_decides_critical_path() -> None:
    sim = Simulator([Resource("link"), Resource("gpu")])
    sim.add_task("X", 5.0, resource="link")
    sim.add_task("Y", 1.0, resource="link")
    sim.add_task("Z", 2.0, resource="gpu", deps=("Y",))
    tl = sim.run()
    # X and Y are both ready at 0; X was added first so it takes the link: X [0,5].
    # Y waits for X's slot: Y [5,6]; Z [6,8]. Makespan 8, although Z's deps only sum to 1 + 2.
    assert tl.makespan == 8.0
    assert tl.ready_time("Y") == 0.0
    assert tl["Y"].start == 5.0
    assert names(tl.critical_path()) == ["X", "Y", "Z"]


def _pipeline(n: int, send: float, compute: float, ret: float) -> Simulator:
    sim = Simulator([Resource("net"), Resource("gpu")])
    for i in range(n):
        sim.add_task(f"S{i}", send, resource="net", category="comm")
    for i in range(n):
        sim.add_task(f"C{i}", compute, resource="gpu", deps=(f"S{i}",), category="compute")
    for i in range(n):
        sim.add_task(f"R{i}", ret, resource="net", deps=(f"C{i}",), category="comm")
    return sim


@pytest.mark.timeout(30)
def test_pipeline_overlap() -> None:
    tl = _pipeline(3, 1.0, 2.0, 1.0).run()
    # net: S0 [0,1], S1 [1,2], S2 [2,3]      (all ready at 0, FIFO by insertion)
    # gpu: C0 [1,3], C1 [3,5] (ready 2, waits for C0), C2 [5,7] (ready 3, waits for C1)
    # net: R0 ready 3 -> [3,4], R1 ready 5 -> [5,6], R2 ready 7 -> [7,8]
    assert tl.makespan == 8.0
    serial = 3 * (1.0 + 2.0 + 1.0)  # 12
    assert tl.makespan < serial
    assert [(tl[f"R{i}"].start, tl[f"R{i}"].end) for i in range(3)] == [
        (3.0, 4.0),
        (5.0, 6.0),
        (7.0, 8.0),
    ]
    # R2 starts at C2's end; C2 waited for C1's gpu slot, C1 for C0's; C0 started at S0's end.
    assert names(tl.critical_path()) == ["S0", "C0", "C1", "C2", "R2"]
    assert tl.category_totals() == {"comm": 6.0, "compute": 6.0}


@pytest.mark.timeout(30)
def test_pipeline_returns_queue_fifo_by_ready_time() -> None:
    tl = _pipeline(3, 1.0, 0.5, 1.0).run()
    # S0 [0,1], C0 [1,1.5] -> R0 ready 1.5. But S1 and S2 have been ready on "net" since 0,
    # so FIFO by ready time serves them first: S1 [1,2], S2 [2,3].
    # C1 [2,2.5] (R1 ready 2.5), C2 [3,3.5] (R2 ready 3.5).
    # net after S2: R0 [3,4], R1 [4,5], R2 [5,6]. Makespan 6 < serial 3 * 2.5 = 7.5.
    assert tl["S2"].start == 2.0
    assert tl.ready_time("R0") == 1.5
    assert [tl[f"R{i}"].start for i in range(3)] == [3.0, 4.0, 5.0]
    assert tl.makespan == 6.0
    # R2 waited for R1's slot, R1 for R0's, R0 for S2's, and so on down the sends.
    assert names(tl.critical_path()) == ["S0", "S1", "S2", "R0", "R1", "R2"]


@pytest.mark.timeout(30)
def test_fifo_ties_by_insertion_order_and_determinism() -> None:
    def build() -> Simulator:
        sim = Simulator([Resource("net"), Resource("gpu")])
        sim.add_task("p", 1.0, resource="gpu")
        # q, b, a all become ready at 1 (end of p); they are served in the order added,
        # not alphabetically: q [1,2], b [2,3], a [3,4].
        sim.add_task("q", 1.0, resource="net", deps=("p",))
        sim.add_task("b", 1.0, resource="net", deps=("p",))
        sim.add_task("a", 1.0, resource="net", deps=("p",))
        # z is ready at 0 and runs first on net: [0, 0.5]
        sim.add_task("z", 0.5, resource="net")
        return sim

    tl = build().run()
    assert tl["z"].start == 0.0
    assert [tl[n].start for n in ("q", "b", "a")] == [1.0, 2.0, 3.0]
    assert tl.makespan == 4.0

    again = build().run()
    assert [(st.name, st.start, st.end) for st in tl] == [
        (st.name, st.start, st.end) for st in again
    ]
    assert tl.to_chrome_trace() == again.to_chrome_trace()


@pytest.mark.timeout(30)
def test_fifo_earlier_ready_beats_earlier_insertion() -> None:
    sim = Simulator([Resource("net")])
    sim.add_task("hold", 2.0, resource="net")
    sim.add_task("d1", 1.5)  # no resource: a pure delay, [0, 1.5]
    sim.add_task("late", 1.0, resource="net", deps=("d1",))  # ready 1.5
    sim.add_task("d2", 0.5)  # [0, 0.5]
    sim.add_task("early", 1.0, resource="net", deps=("d2",))  # ready 0.5
    tl = sim.run()
    # net frees at 2: "early" (ready 0.5) goes before "late" (ready 1.5) though added later.
    assert tl["early"].start == 2.0
    assert tl["late"].start == 3.0
    assert tl.makespan == 4.0


@pytest.mark.timeout(30)
def test_simultaneous_ends_release_dependents_together() -> None:
    sim = Simulator([Resource("g0"), Resource("g1"), Resource("net")])
    sim.add_task("p1", 1.0, resource="g0")
    sim.add_task("p2", 1.0, resource="g1")
    sim.add_task("q", 1.0, resource="net", deps=("p2",))
    sim.add_task("r", 1.0, resource="net", deps=("p1",))
    tl = sim.run()
    # p1 and p2 both end at 1, so q and r are ready at the same instant; q was added first
    # and wins the link even though p1's end comes first in event order: q [1,2], r [2,3].
    assert (tl["q"].start, tl["r"].start) == (1.0, 2.0)
    # r waited for q's slot, q for its dep p2.
    assert names(tl.critical_path()) == ["p2", "q", "r"]


@pytest.mark.timeout(30)
def test_errors() -> None:
    sim = Simulator([Resource("gpu")])
    sim.add_task("a", 1.0, resource="gpu", deps=("missing",))
    with pytest.raises(ValueError, match="unknown task 'missing'"):
        sim.run()

    sim = Simulator()
    sim.add_task("a", 1.0, deps=("c",))
    sim.add_task("b", 1.0, deps=("a",))
    sim.add_task("c", 1.0, deps=("b",))
    sim.add_task("free", 1.0)
    with pytest.raises(ValueError, match="cycle") as info:
        sim.run()
    # a needs c, c needs b, b needs a: the message lists the loop, closed on its first task.
    loop = str(info.value).split("cycle: ")[1].split(" -> ")
    assert loop[0] == loop[-1]
    assert sorted(loop[:-1]) == ["a", "b", "c"]

    sim = Simulator()
    sim.add_task("self", 1.0, deps=("self",))
    with pytest.raises(ValueError, match="cycle: self -> self"):
        sim.run()

    sim = Simulator()
    sim.add_task("a", 1.0)
    with pytest.raises(ValueError, match="duplicate task name 'a'"):
        sim.add_task("a", 2.0)
    with pytest.raises(ValueError, match="duplicate task name 'a'"):
        sim.add(Task("a", 2.0))

    with pytest.raises(ValueError, match="duration"):
        Task("neg", -1.0)
    with pytest.raises(ValueError, match="duration"):
        sim.add_task("neg", -0.5)
    with pytest.raises(ValueError, match="duration"):
        sim.add_task("nan", float("nan"))

    sim = Simulator([Resource("gpu")])
    sim.add_task("a", 1.0, resource="nic")
    with pytest.raises(ValueError, match="unknown resource 'nic'"):
        sim.run()

    with pytest.raises(ValueError, match="duplicate resource 'gpu'"):
        Simulator([Resource("gpu"), Resource("gpu", capacity=2)])
    with pytest.raises(ValueError, match="capacity"):
        Resource("link", capacity=0)


@pytest.mark.timeout(30)
def test_empty_run() -> None:
    tl = Simulator([Resource("gpu")]).run()
    assert tl.makespan == 0.0
    assert tl.critical_path() == []
    assert tl.utilization("gpu") == 0.0
    assert "makespan: 0" in tl.summary()


@pytest.mark.timeout(30)
def test_zero_duration_and_delay_tasks() -> None:
    sim = Simulator([Resource("gpu")])
    sim.add_task("start", 0.0, resource="gpu")
    sim.add_task("work", 2.0, resource="gpu", deps=("start",))
    sim.add_task("lat1", 3.0)  # latency with no resource: [0,3]
    sim.add_task("lat2", 1.0)  # runs alongside lat1: [0,1]
    sim.add_task("sync", 0.0, deps=("work", "lat1", "lat2"))  # a barrier at max(2, 3, 1) = 3
    sim.add_task("after", 1.0, resource="gpu", deps=("sync",))  # [3,4]
    tl = sim.run()
    assert (tl["start"].start, tl["start"].end) == (0.0, 0.0)
    assert (tl["work"].start, tl["work"].end) == (0.0, 2.0)
    assert (tl["lat2"].start, tl["lat2"].end) == (0.0, 1.0)
    assert (tl["sync"].start, tl["sync"].end) == (3.0, 3.0)
    assert tl.makespan == 4.0
    assert names(tl.critical_path()) == ["lat1", "sync", "after"]
    # gpu busy 0 + 2 + 1 = 3 over 4 s
    assert tl.utilization("gpu") == pytest.approx(0.75)

    # A zero-duration tail still ends the critical path: A [0,2], B [2,2].
    sim = Simulator([Resource("gpu")])
    sim.add_task("A", 2.0, resource="gpu")
    sim.add_task("B", 0.0, resource="gpu", deps=("A",))
    assert names(sim.run().critical_path()) == ["A", "B"]


@pytest.mark.timeout(30)
def test_chrome_trace(tmp_path) -> None:
    sim = Simulator([Resource("link", capacity=2), Resource("gpu")])
    sim.add_task("t1", 2.0, resource="link", category="comm")
    sim.add_task("t2", 1.5, resource="link", category="comm")
    sim.add_task("t3", 1.0, resource="link", category="comm")  # waits until t2 ends at 1.5
    sim.add_task("k", 0.25, resource="gpu", deps=("t1", "t3"), category="compute")
    sim.add_task("wait", 0.125, deps=("k",))
    tl = sim.run()
    # t1 [0,2] slot 0, t2 [0,1.5] slot 1, t3 [1.5,2.5] slot 1, k [2.5,2.75], wait [2.75,2.875]
    assert tl["t3"].start == 1.5
    assert tl.makespan == 2.875

    out = tmp_path / "nested" / "dir" / "trace.json"
    trace = tl.to_chrome_trace(out)
    loaded = json.loads(out.read_text())
    assert loaded == trace
    assert loaded["displayTimeUnit"] == "ms"
    events = loaded["traceEvents"]

    complete = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in complete) == ["k", "t1", "t2", "t3", "wait"]
    for e in complete:
        st = tl[e["name"]]
        assert e["ts"] == st.start * 1e6
        assert e["dur"] == (st.end - st.start) * 1e6
        assert e["pid"] == 0
        assert e["args"]["category"] == st.task.category
        assert e["args"]["deps"] == list(st.task.deps)
    by_name = {e["name"]: e for e in complete}
    assert by_name["t3"]["ts"] == 1.5e6 and by_name["t3"]["dur"] == 1.0e6

    rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert all(e["ph"] == "M" for e in events if e["name"] == "thread_name")
    # Every X event sits on a named row; link has two rows, gpu one, delays one.
    assert {e["tid"] for e in complete} <= set(rows)
    assert sorted(rows.values()) == ["(no resource)", "gpu", "link [0]", "link [1]"]
    assert rows[by_name["wait"]["tid"]] == "(no resource)"
    # t1 and t2 overlap on the capacity-2 link: different rows. t3 reuses t2's row.
    assert by_name["t1"]["tid"] != by_name["t2"]["tid"]
    assert by_name["t3"]["tid"] == by_name["t2"]["tid"]
    # No two X events on one row overlap (chrome://tracing needs nested slices).
    for tid in rows:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in complete if e["tid"] == tid)
        assert all(a[1] <= b[0] for a, b in pairwise(spans))


@pytest.mark.timeout(30)
def test_utilization_and_category_totals() -> None:
    sim = Simulator([Resource("gpu"), Resource("link", capacity=2), Resource("idle")])
    sim.add_task("c1", 3.0, resource="gpu", category="compute")
    sim.add_task("c2", 1.0, resource="gpu", deps=("c1",), category="compute")
    sim.add_task("m1", 2.0, resource="link", category="comm")
    sim.add_task("m2", 2.0, resource="link", category="comm")
    sim.add_task("lat", 0.5, deps=("m1",))
    tl = sim.run()
    # gpu: c1 [0,3], c2 [3,4] -> makespan 4; link: m1, m2 both [0,2]; lat [2,2.5]
    assert tl.makespan == 4.0
    assert tl.busy_time("gpu") == 4.0
    assert tl.busy_time("link") == 4.0  # 2 + 2 slot-seconds
    assert tl.utilization("gpu") == pytest.approx(1.0)  # 4 / 4 / 1
    assert tl.utilization("link") == pytest.approx(0.5)  # 4 / 4 / 2
    assert tl.utilization("idle") == 0.0
    assert tl.category_totals() == {"compute": 4.0, "comm": 4.0, "": 0.5}
    assert [st.name for st in tl.by_resource()["gpu"]] == ["c1", "c2"]
    assert tl.by_resource()["idle"] == []
    with pytest.raises(KeyError):
        tl.busy_time("nope")
    text = tl.summary()
    assert "makespan: 4" in text and "c1 -> c2" in text and "50.00%" in text


@pytest.mark.timeout(30)
def test_timeline_from_measured_tasks() -> None:
    # Timelines can be built from measured intervals; slots and blockers are then derived.
    tasks = [
        ScheduledTask(Task("a", 2.0, resource="net"), 0.0, 2.0),
        ScheduledTask(Task("b", 1.0, resource="net"), 2.0, 3.0),
        ScheduledTask(Task("c", 1.0, deps=("b",)), 3.0, 4.0),
    ]
    tl = Timeline(tasks, [Resource("net")])
    assert tl.makespan == 4.0
    assert names(tl.critical_path()) == ["a", "b", "c"]


@pytest.mark.timeout(30)
def test_random_dag_respects_deps_and_capacity() -> None:
    rng = random.Random(1234)
    caps = {"gpu0": 1, "gpu1": 2, "net": 3, "nvlink": 1}
    sim = Simulator(Resource(n, c) for n, c in caps.items())
    n_tasks = 20_000
    res_names = [*caps, None]
    for i in range(n_tasks):
        k = rng.randint(0, min(i, 4))
        deps = tuple(f"t{j}" for j in rng.sample(range(max(0, i - 200), i), k)) if i else ()
        # Integer-valued durations make many ends coincide, exercising the tie handling.
        sim.add_task(f"t{i}", float(rng.randint(1, 5)), resource=rng.choice(res_names), deps=deps)
    tl = sim.run()
    assert len(tl) == n_tasks

    ends = {r: {st.end for st in lst} for r, lst in tl.by_resource().items()}
    for st in tl:
        assert st.end == st.start + st.task.duration
        ready = max((tl[d].end for d in st.task.deps), default=0.0)
        assert st.start >= ready
        assert tl.ready_time(st.name) == ready
        if st.start > ready:
            # A task only waits for a full resource; a slot freed exactly when it started.
            assert st.resource is not None
            assert st.start in ends[st.resource]

    for name, cap in caps.items():
        sweep = []
        for st in tl.by_resource()[name]:
            sweep.append((st.start, 1))
            sweep.append((st.end, -1))
        # Ends sort before starts at the same instant: a freed slot may be reused at once.
        sweep.sort(key=lambda e: (e[0], e[1]))
        running = peak = 0
        for _, delta in sweep:
            running += delta
            peak = max(peak, running)
        assert peak <= cap
        assert peak == cap  # with this much load every slot gets used

    path = tl.critical_path()
    assert path[-1].end == tl.makespan
    assert all(a.end == b.start for a, b in pairwise(path))
