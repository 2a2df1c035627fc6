"""Configuration of Prague's decentralized training (Luo et al., ASPLOS '20; design note
`prague.md` sections 2 and 7): the group generator's policy, the heterogeneity injected,
and one training run.

Every field is checked in ``__post_init__`` and a bad one raises `ConfigFieldError` naming
the field, so the CLI can turn it into one line that names the user's flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from furnace.runtime.cliargs import ConfigFieldError

# allreduce: DDP, every step (the baseline Prague replaces); prague: P-Reduce among groups
# from the group generator; adpsgd: AD-PSGD with the bipartite fix; adpsgd_naive: every
# worker active (deadlocks, broken by timeouts that are counted); dpsgd: D-PSGD on a ring;
# localsgd: local steps with a periodic world average
MODES = ("allreduce", "prague", "adpsgd", "adpsgd_naive", "dpsgd", "localsgd")
POLICIES = ("random", "static", "buffered", "division", "ready_window")
# p2p: a leader gathers, averages and scatters on the world group (tag = group seq);
# cached: a member-only gloo group per distinct member set, created on first use;
# precreated: every group of a static schedule created up front, in one order on all ranks
BACKENDS = ("p2p", "cached", "precreated")
TASKS = ("digits_cnn", "digits_mlp")


def _check(ok: bool, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigFieldError(name, allowed)


@dataclass(frozen=True)
class PolicyConfig:
    """How the group generator forms groups (section 2.3 of the note).

    ``group_size`` is g for random, buffered and division, and the largest group for
    ready_window. ``window_ms`` is the ready window: the first ready worker opens it and
    every worker ready before it closes joins (Hetu's partner selection). ``divisions`` and
    ``division_period`` set Group Division: groups form inside ``divisions`` disjoint
    sets of workers, re-drawn after every ``division_period`` groups. ``static`` walks the
    two partitions of a ``grid_rows`` x (world / grid_rows) grid: rows, then columns.
    """

    name: str = "ready_window"
    group_size: int = 3
    window_ms: float = 10.0
    divisions: int = 2
    division_period: int = 16
    grid_rows: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self.name in POLICIES, "policy", f"one of {', '.join(POLICIES)}")
        _check(self.group_size >= 2, "group_size", f">= 2, got {self.group_size}")
        _check(math.isfinite(self.window_ms) and self.window_ms >= 0, "window_ms",
               f"a finite number >= 0, got {self.window_ms}")
        _check(self.divisions >= 1, "divisions", f">= 1, got {self.divisions}")
        _check(self.division_period >= 1, "division_period",
               f">= 1, got {self.division_period}")
        _check(self.grid_rows >= 1, "grid_rows", f">= 1, got {self.grid_rows}")

    def check_world(self, world_size: int) -> None:
        """The checks that need the number of workers."""
        _check(self.group_size <= world_size, "group_size",
               f"at most the {world_size} workers, got {self.group_size}")
        if self.name == "division":
            _check(self.divisions <= world_size // 2, "divisions",
                   f"at most {world_size // 2} (two workers each) for {world_size} workers, "
                   f"got {self.divisions}")
        if self.name == "static":
            _check(world_size % self.grid_rows == 0, "grid_rows",
                   f"a divisor of the {world_size} workers, got {self.grid_rows}")


@dataclass(frozen=True)
class HeteroConfig:
    """The heterogeneity injected (section 7.1 item 6 of the note).

    ``slow`` holds (rank, factor) pairs: that rank's emulated compute takes factor times as
    long. A transient slowdown hits any rank's step with probability ``transient_prob`` and
    multiplies it by ``transient_factor``. ``slow_links`` holds (rank, bytes per second):
    that rank sleeps bytes / rate before each message it sends (an emulated slow link).
    """

    slow: tuple[tuple[int, float], ...] = ()
    transient_prob: float = 0.0
    transient_factor: float = 1.0
    slow_links: tuple[tuple[int, float], ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        for rank, factor in self.slow:
            _check(rank >= 0, "slow", f"ranks >= 0, got {rank}")
            _check(math.isfinite(factor) and factor >= 1.0, "slow",
                   f"factors >= 1 (a slowdown), got {factor:g} for rank {rank}")
        _check(len({r for r, _ in self.slow}) == len(self.slow), "slow", "each rank once")
        _check(0.0 <= self.transient_prob <= 1.0, "transient_prob",
               f"a probability in [0, 1], got {self.transient_prob}")
        _check(math.isfinite(self.transient_factor) and self.transient_factor >= 1.0,
               "transient_factor", f">= 1, got {self.transient_factor}")
        for rank, rate in self.slow_links:
            _check(rank >= 0, "slow_links", f"ranks >= 0, got {rank}")
            _check(math.isfinite(rate) and rate > 0, "slow_links",
                   f"a rate > 0 bytes/s, got {rate:g} for rank {rank}")

    def check_world(self, world_size: int) -> None:
        for rank, _ in self.slow:
            _check(rank < world_size, "slow", f"ranks in 0..{world_size - 1}, got {rank}")
        for rank, _ in self.slow_links:
            _check(rank < world_size, "slow_links",
                   f"ranks in 0..{world_size - 1}, got {rank}")

    def factor(self, rank: int) -> float:
        return dict(self.slow).get(rank, 1.0)


@dataclass(frozen=True)
class RunConfig:
    """One decentralized training run.

    Every worker trains on its own shard (iid, or label-skewed with ``label_alpha``) with
    ``batch_size`` samples per step and its own optimizer state (SGD with momentum).
    ``compute_ms`` is the emulated accelerator time of one step at factor 1, slept after
    the real forward and backward so that several processes on two cores measure
    synchronization rather than CPU contention.
    A run lasts ``duration_s`` of wall time (each worker stops on its own clock; allreduce,
    dpsgd and localsgd decide collectively), or ``max_steps`` steps per worker, whichever
    comes first; ``stop_at_accuracy`` ends a synchronous run once its model reaches it.
    Models are snapshotted every ``snapshot_every_s`` and averaged after the run, which is
    how accuracy against wall time is scored. ``timeout_s`` bounds every wait.
    """

    mode: str = "prague"
    world_size: int = 4
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    backend: str = "p2p"
    task: str = "digits_cnn"
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    compute_ms: float = 20.0
    duration_s: float = 5.0
    max_steps: int = 10**9
    stop_at_accuracy: float | None = None
    snapshot_every_s: float = 0.1
    local_sgd_period: int = 8
    overlap: bool = True
    # with overlap (prague, adpsgd): how many steps a worker may compute while its own
    # group (exchange) is still in flight; it joins the next one as soon as that ends,
    # and waits only after this many (1: wait after every step)
    max_staleness: int = 1
    # also score every worker's own model at every ``local_score_every``-th snapshot (0:
    # never): decentralized training has no average model unless it pays a world
    # all-reduce, and what each worker holds is what mixing decides (note 7.2)
    local_score_every: int = 0
    hetero: HeteroConfig = field(default_factory=HeteroConfig)
    timeout_s: float = 30.0
    mlp_hidden: int = 1024
    # None: iid shards; a Dirichlet concentration: label-skewed shards (tasks.shard)
    label_alpha: float | None = None
    # each rank's initial parameters plus this much iid noise (seeded by rank), so that
    # the consensus distance starts above zero and its decay per synchronization shows
    init_spread: float = 0.0
    # fault injection for tests: (rank, step) makes that rank stop answering at that step
    fail: tuple[int, int] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self.mode in MODES, "mode", f"one of {', '.join(MODES)}")
        _check(self.backend in BACKENDS, "backend", f"one of {', '.join(BACKENDS)}")
        _check(self.task in TASKS, "task", f"one of {', '.join(TASKS)}")
        _check(self.world_size >= 2, "world_size", f">= 2 workers, got {self.world_size}")
        _check(self.batch_size >= 1, "batch_size", f">= 1, got {self.batch_size}")
        # lr 0 is allowed: pure mixing runs (init_spread) measure consensus alone
        _check(math.isfinite(self.lr) and self.lr >= 0, "lr", f">= 0, got {self.lr}")
        _check(math.isfinite(self.init_spread) and self.init_spread >= 0, "init_spread",
               f">= 0, got {self.init_spread}")
        _check(0.0 <= self.momentum < 1.0, "momentum", f"in [0, 1), got {self.momentum}")
        _check(math.isfinite(self.compute_ms) and self.compute_ms >= 0, "compute_ms",
               f">= 0, got {self.compute_ms}")
        _check(math.isfinite(self.duration_s) and self.duration_s > 0, "duration_s",
               f"> 0, got {self.duration_s}")
        _check(self.max_steps >= 1, "max_steps", f">= 1, got {self.max_steps}")
        if self.stop_at_accuracy is not None:
            _check(0.0 < self.stop_at_accuracy <= 1.0, "stop_at_accuracy",
                   f"in (0, 1], got {self.stop_at_accuracy}")
        _check(self.snapshot_every_s > 0, "snapshot_every_s",
               f"> 0, got {self.snapshot_every_s}")
        _check(self.local_sgd_period >= 1, "local_sgd_period",
               f">= 1, got {self.local_sgd_period}")
        _check(math.isfinite(self.timeout_s) and self.timeout_s > 0, "timeout_s",
               f"> 0, got {self.timeout_s}")
        if self.label_alpha is not None:
            _check(math.isfinite(self.label_alpha) and self.label_alpha > 0, "label_alpha",
                   f"a finite number > 0, got {self.label_alpha}")
        _check(self.mlp_hidden >= 1, "mlp_hidden", f">= 1, got {self.mlp_hidden}")
        _check(self.max_staleness >= 1, "max_staleness", f">= 1 step, got "
               f"{self.max_staleness}")
        _check(self.local_score_every >= 0, "local_score_every", f">= 0, got "
               f"{self.local_score_every}")
        if self.mode == "adpsgd":
            _check(self.world_size >= 2, "world_size", "at least one active and one passive")
        if self.backend == "precreated":
            _check(self.mode != "prague" or self.policy.name == "static", "backend",
                   "precreated only with --policy static (the groups must be known up "
                   "front); use p2p or cached")
        self.policy.check_world(self.world_size)
        self.hetero.check_world(self.world_size)
