"""The group generator's invariants (design note `prague.md` section 2.3), on the pure
decision logic: the requester is in its group, no duplicates, every member's queue in
increasing sequence order, buffered and division groups disjoint, and a request always
answered (at once, or when the ready window closes); and the run config's checks that
name their field.
"""

from __future__ import annotations

import random

import pytest

from furnace.decentralized.config import PolicyConfig, RunConfig
from furnace.decentralized.generator import Group, GroupGenerator, static_partitions
from furnace.runtime.cliargs import ConfigFieldError

# pure Python: nothing here depends on the torch thread count
pytestmark = pytest.mark.thread_independent

POLICY_CASES = [
    PolicyConfig("random", group_size=3),
    PolicyConfig("buffered", group_size=2),
    PolicyConfig("buffered", group_size=3),
    PolicyConfig("division", group_size=2, divisions=2, division_period=5),
    PolicyConfig("ready_window", group_size=3, window_ms=5.0),
    PolicyConfig("static", grid_rows=2),
]


def _drive(policy: PolicyConfig, world: int, seed: int, rounds: int = 200
           ) -> tuple[GroupGenerator, list[tuple[int, list[Group]]]]:
    """Random workers request and get satisfied as they would in a run: a rank with an
    outstanding request waits; the others request in random order with random times."""
    rng = random.Random(seed)
    gen = GroupGenerator(policy, world)
    now = 0.0
    answers: list[tuple[int, list[Group]]] = []
    for _ in range(rounds):
        now += rng.expovariate(1000.0)
        free = [r for r in range(world) if r not in gen.pending]
        answers.append((-1, gen.tick(now)))
        if not free:
            now = gen.deadline if gen.deadline is not None else now
            answers.append((-1, gen.tick(now)))
            continue
        rank = rng.choice(free)
        answers.append((rank, gen.request(rank, now)))
    answers.append((-1, gen.tick(float("inf"))))
    # shutdown: every rank without an outstanding request retires; a lone worker left in
    # a ready window is released by the last retirement
    for r in range(world):
        if r not in gen.pending:
            answers.append((-1, gen.retire(r)))
    return gen, answers


@pytest.mark.parametrize("policy", POLICY_CASES, ids=lambda p: f"{p.name}-g{p.group_size}")
@pytest.mark.parametrize("world", [4, 6, 8])
def test_invariants(policy: PolicyConfig, world: int) -> None:
    if policy.name == "static" and world % policy.grid_rows:
        pytest.skip("grid needs rows dividing the world")
    for seed in range(5):
        gen, answers = _drive(policy, world, seed)
        for rank, issued in answers:
            if rank >= 0 and policy.name in ("random", "buffered", "division"):
                # these answer at once, with a group that contains the requester
                assert len(issued) == 1 and rank in issued[0].members
            for group in issued:
                assert len(set(group.members)) == len(group.members)
                assert list(group.members) == sorted(group.members)
                assert set(group.owners) <= set(group.members)
        for m, q in enumerate(gen.queues):
            seqs = [g.seq for g in q]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (m, seqs)
            assert all(m in g.members for g in q)
        # every request was satisfied by exactly one group it owns
        owned = [sum(m in g.owners for g in gen.issued) for m in range(world)]
        requests = [sum(1 for r, _ in answers if r == m) for m in range(world)]
        assert not gen.pending
        if policy.name != "static":
            assert owned == requests


def test_ready_window_groups_whoever_is_ready() -> None:
    gen = GroupGenerator(PolicyConfig("ready_window", group_size=3, window_ms=10.0), 6)
    assert gen.request(4, 0.000) == []
    assert gen.request(1, 0.004) == []
    assert gen.tick(0.009) == []
    [group] = gen.tick(0.010)
    assert group.members == (1, 4) and group.owners == (1, 4)
    # a lone worker waits past the deadline for a partner, then closes with it
    assert gen.request(3, 0.5) == []
    assert gen.tick(0.9) == []
    [pair] = gen.request(0, 0.95)
    assert pair.members == (0, 3)
    # and a lone worker whose peers have all retired is released alone
    gen.request(5, 0.96)
    for r in (0, 1, 2, 3):
        assert gen.retire(r) == []
    [alone] = gen.retire(4)
    assert alone.members == (5,)
    gen = GroupGenerator(PolicyConfig("ready_window", group_size=3, window_ms=10.0), 6)
    # a full window closes at once
    gen.request(0, 1.0)
    gen.request(2, 1.001)
    [full] = gen.request(5, 1.002)
    assert full.members == (0, 2, 5)


def test_buffered_groups_come_from_one_partition() -> None:
    gen = GroupGenerator(PolicyConfig("buffered", group_size=2, seed=3), 8)
    issued = []
    for rank in (0, 1, 2, 3, 4, 5, 6, 7):
        if rank in gen.pending or any(rank in g.members for g in issued):
            continue
        issued += gen.request(rank, 0.0)
    # one draw: the groups handed out before a refresh are disjoint and cover everyone
    members = [m for g in issued for m in g.members]
    assert sorted(members) == list(range(8))


def test_division_groups_stay_inside_their_division() -> None:
    gen = GroupGenerator(PolicyConfig("division", group_size=2, divisions=2,
                                      division_period=1000, seed=1), 8)
    groups = []
    for k in range(40):
        rank = k % 8
        if rank in gen.pending:
            gen.pending.discard(rank)
        groups += gen.request(rank, float(k))
    divisions = gen._divisions
    for g in groups:
        assert any(set(g.members) <= set(d) for d in divisions)
    assert len(divisions) == 2 and not set(divisions[0]) & set(divisions[1])


def test_static_partitions_are_rows_then_columns() -> None:
    assert static_partitions(8, 2) == [[(0, 1, 2, 3), (4, 5, 6, 7)],
                                       [(0, 4), (1, 5), (2, 6), (3, 7)]]
    assert static_partitions(4, 1) == [[(0, 1, 2, 3)]]


def test_group_round_trips_through_its_encoding() -> None:
    g = Group(17, (0, 3, 5), (3,))
    assert Group.decode(g.encode()) == g


def test_second_outstanding_request_is_refused() -> None:
    gen = GroupGenerator(PolicyConfig("ready_window", group_size=4, window_ms=5.0), 4)
    gen.request(1, 0.0)
    with pytest.raises(ValueError, match="outstanding"):
        gen.request(1, 0.001)


@pytest.mark.parametrize(("policy", "world", "field"), [
    (PolicyConfig("random", group_size=5), 4, "group_size"),
    (PolicyConfig("division", divisions=3), 4, "divisions"),
    (PolicyConfig("static", grid_rows=3), 4, "grid_rows"),
])
def test_world_checks_name_the_field(policy: PolicyConfig, world: int, field: str) -> None:
    with pytest.raises(ConfigFieldError) as info:
        GroupGenerator(policy, world)
    assert info.value.field == field


@pytest.mark.parametrize(("over", "field"), [
    ({"max_staleness": 0}, "max_staleness"),
    ({"local_score_every": -1}, "local_score_every"),
])
def test_run_config_refuses_and_names_the_field(over: dict[str, int], field: str) -> None:
    with pytest.raises(ConfigFieldError) as info:
        RunConfig(**over)
    assert info.value.field == field
