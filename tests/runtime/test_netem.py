"""The network emulator and its virtual clock: exact modelled values in both modes (the
wall-clock behaviour of sleep mode is measured by benchmarks/runtime/bench_netem.py)."""

from __future__ import annotations

import math
import time

import pytest
import torch
import torch.distributed as dist

from furnace.runtime.comm import Communicator
from furnace.runtime.launch import run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator, VirtualClock
from furnace.runtime.presets import emulated_link
from furnace.runtime.topology import Device, Link, Topology

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


def _virtual_sequence(rank: int, world_size: int, topo: Topology) -> dict:
    net = NetworkEmulator(NetworkEmulation(topology=topo, mode="virtual"))
    comm = Communicator(network=net)
    t = {}
    comm.barrier()
    t["barrier"] = net.now()
    comm.all_reduce(torch.zeros(1000))
    t["all_reduce"] = net.now()
    if rank == 0:
        net.compute(1e9, "float32")
    t["compute"] = net.now()
    comm.barrier()
    t["barrier2"] = net.now()
    if rank == 0:
        comm.send(torch.zeros(1000), 1)
    else:
        comm.recv(torch.zeros(1000), 0)
    t["send"] = net.now()
    if rank == 0:
        handles = [comm.isend(torch.zeros(2000), 1), comm.isend(torch.zeros(2000), 1)]
        net.compute(5e8, "float32")
    else:
        handles = [comm.irecv(torch.zeros(2000), 0), comm.irecv(torch.zeros(2000), 0)]
    for h in handles:
        h.wait()
    t["async"] = net.now()
    comm.barrier()
    t["end"] = net.now()
    t["modelled"] = [r.modelled_s for r in comm.log.records]
    t["clock"] = {r.clock for r in comm.log.records}
    return t


@pytest.mark.timeout(60)
def test_virtual_clock_exact_values(slow_link):
    out = run_distributed(_virtual_sequence, 2, slow_link)
    r0, r1 = out
    # slow_link: 1 MB/s, 1 ms; the nominal device does 10 GFLOP/s in float32
    # barrier: one latency step, no payload
    assert r0["barrier"] == r1["barrier"] == pytest.approx(0.001, abs=1e-12)
    # ring all-reduce of 4000 B on 2 ranks: 2 steps + 4000 B / 1 MB/s = 6 ms
    assert r0["all_reduce"] == r1["all_reduce"] == pytest.approx(0.007, abs=1e-12)
    # rank 0 computes 1e9 FLOP at 10 GFLOP/s = 100 ms
    assert r0["compute"] == pytest.approx(0.107, abs=1e-12)
    assert r1["compute"] == pytest.approx(0.007, abs=1e-12)
    # the barrier ends when its slowest member's arrival allows: 107 ms + 1 ms
    assert r0["barrier2"] == r1["barrier2"] == pytest.approx(0.108, abs=1e-12)
    # 4000 B message: 1 ms + 4 ms; the receiver completes with the sender
    assert r0["send"] == r1["send"] == pytest.approx(0.113, abs=1e-12)
    # two 8000 B sends queue on rank 0's link (9 ms each): ends at 122 and 131 ms, while
    # rank 0 computes 50 ms (to 163 ms); rank 1 waits until the second arrives
    assert r0["async"] == pytest.approx(0.163, abs=1e-12)
    assert r1["async"] == pytest.approx(0.131, abs=1e-12)
    assert r0["end"] == r1["end"] == pytest.approx(0.164, abs=1e-12)
    assert r0["modelled"][1] == pytest.approx(0.006, abs=1e-12)
    assert r0["clock"] == {"virtual-clock"}


@pytest.mark.timeout(60)
def test_virtual_clock_is_deterministic(slow_link):
    first = run_distributed(_virtual_sequence, 2, slow_link)
    second = run_distributed(_virtual_sequence, 2, slow_link)
    assert first == second


def _two_level(rank: int, world_size: int, topo: Topology) -> dict:
    net = NetworkEmulator(NetworkEmulation(topology=topo, mode="virtual"))
    comm = Communicator(network=net)
    node = dist.new_group([0, 1])
    other = dist.new_group([2, 3])
    mine = Communicator(node if rank < 2 else other, network=net, name="node")
    out = {}
    t0 = net.now()
    comm.all_reduce(torch.zeros(1000))
    out["world_all_reduce"] = net.now() - t0
    t0 = net.now()
    mine.all_reduce(torch.zeros(1000))
    out["node_all_reduce"] = net.now() - t0
    t0 = net.now()
    comm.all_to_all_single(torch.zeros(1000))
    out["a2a"] = net.now() - t0
    return out


@pytest.mark.timeout(60)
def test_slowest_link_paces_collectives():
    fast = Link(name="fast", latency_s=0.0, bandwidth_Bps=1e8)
    slow = Link(name="slow", latency_s=1e-3, bandwidth_Bps=1e6)
    topo = Topology(name="two-level", device=emulated_link(bandwidth_Bps=1).device,
                    ranks_per_node=2, intra_node=fast, inter_node=slow)
    out = run_distributed(_two_level, 4, topo)
    for r in out:
        # the 4-rank ring crosses the slow link: 6 steps + 2*3/4*4000 B / 1 MB/s = 12 ms
        assert r["world_all_reduce"] == pytest.approx(0.012, abs=1e-12)
        # inside a node: 4000 B over 100 MB/s, no latency = 40 us
        assert r["node_all_reduce"] == pytest.approx(4e-5, abs=1e-12)
        # 1000 B to each of 3 peers: 1000 B on the fast link, 2000 B on the slow one in
        # parallel: max(10 us, 1 ms + 2 ms)
        assert r["a2a"] == pytest.approx(0.003, abs=1e-12)


def _ops(comm: Communicator) -> None:
    comm.barrier()
    comm.all_reduce(torch.zeros(2**16))
    comm.all_gather(torch.zeros(2**15))
    comm.broadcast(torch.zeros(2**16), 0)
    comm.all_to_all_single(torch.zeros(2**16))
    comm.reduce_scatter(torch.zeros(2**16))
    if comm.rank == 0:
        comm.send(torch.zeros(2**16), 1)
    else:
        comm.recv(torch.zeros(2**16), 0)
    comm.barrier()


class _RecordingEmulator(NetworkEmulator):
    """A `NetworkEmulator` that keeps every duration it models, in the order it charges them."""

    def __init__(self, config: NetworkEmulation) -> None:
        super().__init__(config)
        self.durations: list[float] = []

    def duration(self, tr, global_ranks):
        seconds = super().duration(tr, global_ranks)
        self.durations.append(seconds)
        return seconds


def _sequence(rank: int, world_size: int, mode: str) -> dict:
    topo = emulated_link(bandwidth_Bps=10e6, latency_s=2e-3)
    net = _RecordingEmulator(NetworkEmulation(topology=topo, mode=mode))
    comm = Communicator(network=net)
    comm.barrier()
    before = len(comm.log)
    net.durations.clear()
    t0 = net.now()
    _ops(comm)
    return {"elapsed": net.now() - t0 if mode == "virtual" else None,
            "durations": net.durations,
            "records": [(r.op, r.modelled_s, r.clock) for r in comm.log.records[before:]],
            # modelled ends are absolute monotonic times in sleep mode: their rounding
            "slack": 16 * math.ulp(time.monotonic())}


@pytest.mark.timeout(90)
def test_sleep_mode_models_what_the_virtual_clock_does():
    virtual = run_distributed(_sequence, 2, "virtual")
    sleep = run_distributed(_sequence, 2, "sleep")
    # 10 MB/s, 2 ms: barrier 2 + all-reduce 30.21 + all-gather 15.11 + broadcast 28.21
    # + all-to-all 15.11 + reduce-scatter 15.11 + send 28.21 + barrier 2 = 135.96 ms
    assert max(r["elapsed"] for r in virtual) == pytest.approx(0.1359648, abs=1e-9)
    # the sender runs its ops back to back, so its clock is the sum of what they cost
    assert sum(virtual[0]["durations"]) == pytest.approx(0.1359648, rel=1e-12)
    for v, s in zip(virtual, sleep):
        # both modes price every op with one model (the receiver prices no recv)
        assert s["durations"] == v["durations"]
        charged = [(op, modelled) for op, modelled, _ in s["records"] if op != "recv"]
        assert len(charged) == len(s["durations"])
        assert {clock for _, _, clock in s["records"]} == {"emulated"}
        for (op, modelled), seconds in zip(charged, s["durations"]):
            # no op completes sooner than the topology allows
            assert modelled >= seconds - s["slack"], (op, modelled, seconds)


def _overlap(rank: int, world_size: int) -> dict:
    topo = emulated_link(bandwidth_Bps=10e6, latency_s=2e-3)
    net = NetworkEmulator(NetworkEmulation(topology=topo, mode="virtual"))
    comm = Communicator(network=net)
    flops = 1e9  # 100 ms on the nominal 10 GFLOP/s device, about the transfer's time

    def timed(fn) -> float:
        comm.barrier()
        t0 = net.now()
        fn()
        return net.now() - t0

    def overlapped() -> None:
        handle = comm.all_reduce(torch.zeros(2**18), async_op=True)
        net.compute(flops)
        handle.wait()

    def sequential() -> None:
        comm.all_reduce(torch.zeros(2**18))
        net.compute(flops)

    out = {"compute": timed(lambda: net.compute(flops)),
           "comm": timed(lambda: comm.all_reduce(torch.zeros(2**18))),
           "sequential": timed(sequential),
           "overlapped": timed(overlapped)}
    out["modelled"] = comm.log.records[-1].modelled_s
    return out


@pytest.mark.timeout(60)
def test_compute_overlaps_emulated_communication():
    # the measured counterpart, compute really overlapping a sleeping op, is
    # benchmarks/runtime/bench_netem.py
    for r in run_distributed(_overlap, 2):
        # 1 MiB ring all-reduce on 2 ranks: 2 * 2 ms + 1 MiB / 10 MB/s = 108.86 ms
        transfer = 2 * 2e-3 + 2**20 / 10e6
        assert r["modelled"] == pytest.approx(transfer, rel=1e-12)
        assert r["comm"] == pytest.approx(transfer, rel=1e-12)
        assert r["compute"] == pytest.approx(0.1, rel=1e-12)
        assert r["sequential"] == pytest.approx(transfer + 0.1, rel=1e-12)
        # an async op runs beside the compute: the pair takes the longer of the two
        assert r["overlapped"] == pytest.approx(max(transfer, 0.1), rel=1e-12)


def test_config_and_clock_errors(slow_link):
    with pytest.raises(ValueError, match="mode"):
        NetworkEmulation(topology=slow_link, mode="fast")
    clock = VirtualClock()
    clock.advance(0.5)
    clock.advance_to(0.2)
    assert clock.now == 0.5
    with pytest.raises(ValueError):
        clock.advance(-1)
    sleep_net = NetworkEmulator(NetworkEmulation(topology=slow_link), rank=0)
    assert sleep_net.label == "emulated"
    with pytest.raises(RuntimeError, match="virtual clock"):
        sleep_net.advance(1.0)
    virtual = NetworkEmulator(NetworkEmulation(topology=slow_link, mode="virtual"), rank=0)
    assert virtual.compute(2e10, "float32") == pytest.approx(2.0)
    assert virtual.now() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no peak figure for int8"):
        virtual.compute(1.0, torch.int8)


def test_device_of_emulated_link_is_nominal():
    dev = emulated_link(bandwidth_Bps=1e6).device
    assert isinstance(dev, Device) and dev.flops("float32") == 10e9
