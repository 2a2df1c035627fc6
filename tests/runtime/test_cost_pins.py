"""Runtime times pinned from before they moved onto `furnace.runtime.cost` (issue 12).

The literals were computed with the code as it stood before the change (`Link.time`,
`Device.compute_time`, `NetworkEmulator.duration` with their own alpha-beta formulas), on
fixed inputs that reach every branch: ring ops and direct exchanges on a three-level
Sunway topology whose groups are joined by a 16:3 oversubscribed link, on a two-level H100
cluster and on a flat emulated link. Routing the formulas through `cost` must not move any
of them.
"""

from __future__ import annotations

import pytest

from furnace.runtime.comm import traffic
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import emulated_link, h100_ib, sunway_oceanlight, v100_50gbps
from furnace.runtime.topology import Topology

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

# the arithmetic is unchanged, so the times agree to the last bit or nearly
RTOL = 1e-12


def pinned(expected: float) -> object:
    """``expected`` to RTOL of itself; a pinned zero must stay exactly zero."""
    return pytest.approx(expected, rel=RTOL, abs=0.0)


def topologies() -> dict[str, Topology]:
    return {
        # 12 ranks to a supernode, so the larger groups below cross the tapered level
        "sun": sunway_oceanlight(nodes_per_supernode=2),
        "h100": h100_ib(gpus_per_node=4),
        "emu": emulated_link(bandwidth_Bps=10e6, latency_s=2e-3, ranks_per_node=2),
    }


def emulator(topology: Topology, rank: int) -> NetworkEmulator:
    return NetworkEmulator(NetworkEmulation(topology=topology, mode="virtual"), rank=rank)


def test_link_and_compute_times_are_pinned():
    topo = topologies()
    links = [
        v100_50gbps().intra_node.time(1e6, 3),
        topo["sun"].inter_group.time(123456789, 7),
        topo["h100"].inter_node.time(5e8),
        topo["emu"].intra_node.time(4096, 0),
    ]
    expected = [0.0001059090909090909, 0.15803868991999998, 0.010005, 0.0004096]
    assert links == [pinned(v) for v in expected]
    computes = [
        topo["h100"].device.compute_time(1e12, "bfloat16"),
        topo["sun"].device.compute_time(3.7e9, "float32"),
        topo["emu"].device.compute_time(123456.0),
    ]
    expected = [0.0010111223458038423, 0.0015823235923022097, 1.23456e-05]
    assert computes == [pinned(v) for v in expected]


def test_virtual_clock_compute_is_pinned():
    em = emulator(topologies()["sun"], 0)
    charged = [em.compute(2.5e9, "float16"), em.compute(1e9)]
    expected = [0.00027124773960217, 0.0004276550249465432, 0.0006989027645487131]
    assert charged + [em.clock.now] == [pinned(v) for v in expected]


# (topology, global ranks of the group, op, bytes, modelled seconds for group rank 1)
RING = [('sun', [0, 1, 2, 3], 'all_reduce', 10000003, 0.000298968828125),
     ('sun', [0, 1, 2, 3], 'all_gather', 65536, 6.84e-06),
     ('sun', [0, 1, 2, 3], 'reduce_scatter', 777, 3.04552734375e-06),
     ('sun', [0, 1, 2, 3], 'broadcast', 1048576, 2.348e-05),
     ('sun', [0, 1, 2, 3], 'reduce', 12345, 3.24111328125e-06),
     ('sun', [0, 1, 2, 3], 'barrier', 0, 1e-06),
     ('sun', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'all_reduce', 10000003,
      0.023510672639999997),
     ('sun', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'all_gather', 65536, 0.00094474688),
     ('sun', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'reduce_scatter', 777, 3.294016e-05),
     ('sun', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'broadcast', 1048576, 0.00136417728),
     ('sun', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'reduce', 12345, 3.78016e-05),
     ('sun', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'barrier', 0, 2e-06),
     ('sun', [0, 5, 13, 17, 23], 'all_reduce', 10000003, 0.020496005119999997),
     ('sun', [0, 5, 13, 17, 23], 'all_gather', 65536, 0.00034354431999999996),
     ('sun', [0, 5, 13, 17, 23], 'reduce_scatter', 777, 1.197824e-05),
     ('sun', [0, 5, 13, 17, 23], 'broadcast', 1048576, 0.00135017728),
     ('sun', [0, 5, 13, 17, 23], 'reduce', 12345, 2.38016e-05),
     ('sun', [0, 5, 13, 17, 23], 'barrier', 0, 2e-06),
     ('h100', [0, 1, 2, 3], 'all_reduce', 10000003, 4.533334222222222e-05),
     ('h100', [0, 1, 2, 3], 'all_gather', 65536, 6.436906666666667e-06),
     ('h100', [0, 1, 2, 3], 'reduce_scatter', 777, 6.00518e-06),
     ('h100', [0, 1, 2, 3], 'broadcast', 1048576, 8.33016888888889e-06),
     ('h100', [0, 1, 2, 3], 'reduce', 12345, 6.0274333333333335e-06),
     ('h100', [0, 1, 2, 3], 'barrier', 0, 2e-06),
     ('h100', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'all_reduce', 10000003,
      0.00047666676),
     ('h100', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'all_gather', 65536, 6.941792e-05),
     ('h100', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'reduce_scatter', 777, 5.517094e-05),
     ('h100', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'broadcast', 1048576, 7.597152e-05),
     ('h100', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'reduce', 12345, 5.52469e-05),
     ('h100', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'barrier', 0, 5e-06),
     ('h100', [0, 5, 13, 17, 23], 'all_reduce', 10000003, 0.00036000008),
     ('h100', [0, 5, 13, 17, 23], 'all_gather', 65536, 2.524288e-05),
     ('h100', [0, 5, 13, 17, 23], 'reduce_scatter', 777, 2.0062160000000003e-05),
     ('h100', [0, 5, 13, 17, 23], 'broadcast', 1048576, 4.097152e-05),
     ('h100', [0, 5, 13, 17, 23], 'reduce', 12345, 2.02469e-05),
     ('h100', [0, 5, 13, 17, 23], 'barrier', 0, 5e-06),
     ('emu', [0, 1, 2, 3], 'all_reduce', 10000003, 1.5120004),
     ('emu', [0, 1, 2, 3], 'all_gather', 65536, 0.025660799999999998),
     ('emu', [0, 1, 2, 3], 'reduce_scatter', 777, 0.0062331),
     ('emu', [0, 1, 2, 3], 'broadcast', 1048576, 0.1108576),
     ('emu', [0, 1, 2, 3], 'reduce', 12345, 0.0072345),
     ('emu', [0, 1, 2, 3], 'barrier', 0, 0.002),
     ('emu', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'all_reduce', 10000003, 1.8773338),
     ('emu', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'all_gather', 65536, 0.0940896),
     ('emu', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'reduce_scatter', 777, 0.0228547),
     ('emu', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'broadcast', 1048576, 0.1268576),
     ('emu', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'reduce', 12345,
      0.023234499999999998),
     ('emu', [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22], 'barrier', 0, 0.002),
     ('emu', [0, 5, 13, 17, 23], 'all_reduce', 10000003, 1.6160004000000001),
     ('emu', [0, 5, 13, 17, 23], 'all_gather', 65536, 0.0342144),
     ('emu', [0, 5, 13, 17, 23], 'reduce_scatter', 777, 0.0083108),
     ('emu', [0, 5, 13, 17, 23], 'broadcast', 1048576, 0.1128576),
     ('emu', [0, 5, 13, 17, 23], 'reduce', 12345, 0.0092345),
     ('emu', [0, 5, 13, 17, 23], 'barrier', 0, 0.002)]


@pytest.mark.parametrize(("topo_name", "ranks", "op", "nbytes", "expected"), RING)
def test_ring_durations_are_pinned(topo_name, ranks, op, nbytes, expected):
    tr = traffic(op, rank=1, world_size=len(ranks), nbytes=nbytes)
    em = emulator(topologies()[topo_name], ranks[1])
    assert em.duration(tr, tuple(ranks)) == pinned(expected)


# (topology, global ranks, op, send bytes per peer or message size, receive bytes, seconds):
# all_to_all_single from group rank 1, send from rank 0 to the last, recv of that message
DIRECT = [('sun', [0, 1, 2, 3], 'a2a', [1000, 2017, 3068, 0], [4001, 3002, 2003, 1004],
      1.136875e-06),
     ('sun', [0, 1, 2, 3], 'send', 4000000, None, 7.9125e-05),
     ('sun', [0, 1, 2, 3], 'recv', 4000000, None, 7.9125e-05),
     ('sun', [0, 5, 13, 17, 23], 'a2a', [1000, 2017, 3068, 4153, 0],
      [5000, 4001, 3002, 2003, 1004], 1.1242879999999999e-05),
     ('sun', [0, 5, 13, 17, 23], 'send', 4000000, None, 0.005122000000000001),
     ('sun', [0, 5, 13, 17, 23], 'recv', 4000000, None, 0.005122000000000001),
     ('sun', [0, 3, 6, 9, 12, 15, 18, 21], 'a2a', [1000, 2017, 3068, 4153, 5272, 6425, 7612, 0],
      [7997, 6998, 5999, 5000, 4001, 3002, 2003, 1004], 2.671552e-05),
     ('sun', [0, 3, 6, 9, 12, 15, 18, 21], 'send', 4000000, None, 0.005122000000000001),
     ('sun', [0, 3, 6, 9, 12, 15, 18, 21], 'recv', 4000000, None, 0.005122000000000001),
     ('h100', [0, 1, 2, 3], 'a2a', [1000, 2017, 3068, 0], [4001, 3002, 2003, 1004],
      2.0155733333333333e-06),
     ('h100', [0, 1, 2, 3], 'send', 4000000, None, 1.0888888888888888e-05),
     ('h100', [0, 1, 2, 3], 'recv', 4000000, None, 1.0888888888888888e-05),
     ('h100', [0, 5, 13, 17, 23], 'a2a', [1000, 2017, 3068, 4153, 0],
      [5000, 4001, 3002, 2003, 1004], 5.220180000000001e-06),
     ('h100', [0, 5, 13, 17, 23], 'send', 4000000, None, 8.5e-05),
     ('h100', [0, 5, 13, 17, 23], 'recv', 4000000, None, 8.5e-05),
     ('h100', [0, 3, 6, 9, 12, 15, 18, 21], 'a2a',
      [1000, 2017, 3068, 4153, 5272, 6425, 7612, 0],
      [7997, 6998, 5999, 5000, 4001, 3002, 2003, 1004], 5.530600000000001e-06),
     ('h100', [0, 3, 6, 9, 12, 15, 18, 21], 'send', 4000000, None, 8.5e-05),
     ('h100', [0, 3, 6, 9, 12, 15, 18, 21], 'recv', 4000000, None, 8.5e-05),
     ('emu', [0, 1, 2, 3], 'a2a', [1000, 2017, 3068, 0], [4001, 3002, 2003, 1004], 0.0024001),
     ('emu', [0, 1, 2, 3], 'send', 4000000, None, 0.402),
     ('emu', [0, 1, 2, 3], 'recv', 4000000, None, 0.402),
     ('emu', [0, 5, 13, 17, 23], 'a2a', [1000, 2017, 3068, 4153, 0],
      [5000, 4001, 3002, 2003, 1004], 0.0031009),
     ('emu', [0, 5, 13, 17, 23], 'send', 4000000, None, 0.402),
     ('emu', [0, 5, 13, 17, 23], 'recv', 4000000, None, 0.402),
     ('emu', [0, 3, 6, 9, 12, 15, 18, 21], 'a2a', [1000, 2017, 3068, 4153, 5272, 6425, 7612, 0],
      [7997, 6998, 5999, 5000, 4001, 3002, 2003, 1004], 0.0049006),
     ('emu', [0, 3, 6, 9, 12, 15, 18, 21], 'send', 4000000, None, 0.402),
     ('emu', [0, 3, 6, 9, 12, 15, 18, 21], 'recv', 4000000, None, 0.402)]


@pytest.mark.parametrize(("topo_name", "ranks", "op", "send", "recv", "expected"), DIRECT)
def test_direct_durations_are_pinned(topo_name, ranks, op, send, recv, expected):
    p = len(ranks)
    topo = topologies()[topo_name]
    if op == "a2a":
        tr = traffic("all_to_all_single", rank=1, world_size=p, send_bytes=send,
                     recv_bytes=recv)
        me = ranks[1]
    elif op == "send":
        tr = traffic("send", rank=0, world_size=p, nbytes=send, peer=p - 1)
        me = ranks[0]
    else:
        tr = traffic("recv", rank=p - 1, world_size=p, nbytes=send, peer=0)
        me = ranks[-1]
    assert emulator(topo, me).duration(tr, tuple(ranks)) == pinned(expected)
