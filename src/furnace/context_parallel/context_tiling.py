"""UltraAttn's context tiling (Yang et al., SC'25, §4; design note §2.1-§2.4): which rank
computes which block of the attention grid, chosen to minimise the bottleneck port.

The model (design note §2.3, exactly as the ILP states it). Rank ``g`` computing a block of
q row ``r`` that it does not own needs that row: its owner sends it the row payload (q; in
the backward q, dout, lse and delta) and ``g`` returns the partial result (out with its lse;
in the backward dq). Computing in kv column ``c`` it does not own, ``g`` receives kv (twice
when the backward runs: it fetches again) and, in the backward, returns the dk/dv partial.
With ``H[g, r]`` (g needs row r) and ``V[g, c]`` (g needs column c) that gives the paper's
terms A, B, C, D and its ``Cin`` and ``Cout``, here weighted by the payload's bytes from
`AttentionShape` (so grouped-query K/V, the lse and delta are counted) and summed over the
forward and, unless ``backward=False``, the backward. The objective is the bottleneck port,
``max over g of max(in_g, out_g)``, in units of one q block of ``block_size`` tokens; work
per rank is capped at ``(1 + tau) * ceil(total / CP)`` elements (the paper's tau) and the
diagonal blocks are pinned to their owner.

The solvers:

- `tile2d_ilp`: the ILP with ``scipy.optimize.milp`` (HiGHS). HiGHS takes no starting
  point, so the greedy runs first and the ILP is given its objective as a cutoff: it only
  looks for strictly better tilings, and proving there are none proves the greedy's
  optimal. A time-limited ILP that finds nothing better returns the greedy's tiling, with
  the status saying so.
- `tile2d_greedy`: seeds (owner of the row, owner of the column, a recursive bisection of
  the grid mapped to ranks by what they own, and the ILP over owner tiles, the
  ``CP x CP`` super-blocks whose rows and columns have one owner each), a repair of the
  work cap (exact re-solves of the busiest rank with ranks that have room, then single
  moves), a local search over block and row/column-segment moves, a large-neighbourhood
  search that re-solves the blocks of two ranks at a time exactly (a small ILP), and a
  polish that lowers the busiest rank's work without raising the bottleneck. What scales
  with the grid is vectorised: a 1024-block causal grid on 1024 ranks plans in about two
  seconds, the search then limited by its time.
- `hierarchical_tiling` (§2.4): nodes first (the ILP with nodes as devices, a block's owner
  node from the layout), minimising bytes between nodes; then the blocks of each node over
  its devices, where a payload from another node weighs the ratio of the two links'
  bandwidths. `build_plan`'s transfers go straight from owner to user, so a row that two
  devices of a node need crosses between nodes twice, which the node level cannot see;
  `plan_attention` therefore prices the flat tiling beside it.
- `plan_attention`: every baseline and the tiling under every layout, each priced by
  `estimate_time` (alpha-beta per all-to-all plus the busiest rank's compute), the
  cheapest kept: a plan from a time-limited ILP can never be worse than ring.
- `choose_num_blocks`: the smallest grid whose degree of load imbalance (§2.1) is at most
  theta and whose blocks can be packed within 10% of balance.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linear_sum_assignment, milp

from furnace.runtime.cost import link_time_array, roofline_time
from furnace.runtime.presets import h100_ib
from furnace.runtime.topology import LinkLevel, Topology

from .baselines import baseline_plans
from .config import LayoutError, PlanError
from .kernels import attention_flops
from .layout import LAYOUTS, Layout, make_layout
from .masks import EMPTY, BlockGrid, MaskMod, build_block_grid, sampled_block_grid
from .plan import (
    GRANULARITIES,
    PAYLOAD_KINDS,
    STAGINGS,
    AttentionShape,
    Plan,
    Transfer,
    build_plan,
)

__all__ = [
    "TILING_STATUSES",
    "TilingConfig",
    "TilingProblem",
    "TilingResult",
    "choose_num_blocks",
    "degree_of_imbalance",
    "estimate_time",
    "greedy_assignment",
    "hierarchical_tiling",
    "ilp_assignment",
    "ilp_gap",
    "plan_attention",
    "problem_traffic",
    "tile2d_greedy",
    "tile2d_ilp",
    "tiling_problem",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# "optimal": proven within mip_rel_gap; "time_limit": the best found in the time;
# "heuristic": the greedy's; "infeasible": no tiling meets the work cap (no assignment)
TILING_STATUSES = ("optimal", "time_limit", "heuristic", "infeasible")
# grids up to this many (non-empty blocks x ranks) x-variables get the ILP in plan_attention
DEFAULT_MAX_ILP_SIZE = 4096
# a greedy or ILP tiling must beat the incumbent by this fraction to count as better
_REL_EPS = 1e-9
# instances with at most this many tiles try every seed of the greedy
_SMALL_TILES = 2000
# the owner-tile ILP seed is tried up to this many variables (CP^3)
_MAX_COARSE_VARIABLES = 4096
# seconds a repair of the work cap gets at least
_MIN_REPAIR_S = 0.01
# the most tiles one neighbourhood of the large-neighbourhood search re-solves
_LNS_MAX_FREE = 200
# choose_num_blocks evaluates the mask exactly up to this many (q, kv) pairs
_EXACT_GRID_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class TilingConfig:
    """How the tiling is searched.

    Args:
        time_limit_s: seconds for one `tile2d_ilp` (the greedy warm-up included).
        balance_tolerance: tau; work per rank <= (1 + tau) * ceil(total work / CP).
        backward: objective over the forward and backward bytes (False: forward only).
        pin_diagonal: the non-empty diagonal block (i, i) is computed by the owner of i.
        mip_rel_gap: HiGHS's relative optimality gap.
        greedy_time_s: seconds for the greedy's searches (`tile2d_greedy`, and the
            warm-up of `tile2d_ilp`).
        max_ilp_size: `plan_attention` uses the ILP when non-empty blocks x ranks is at
            most this, the greedy above it.
        relax_steps: when no tiling meets the cap, `plan_attention` retries without the
            diagonal pin, then with tau doubled, this many times.
        seed: of the local search's move order.
    """

    time_limit_s: float = 1.0
    balance_tolerance: float = 0.05
    backward: bool = True
    pin_diagonal: bool = True
    mip_rel_gap: float = 1e-4
    greedy_time_s: float = 0.3
    max_ilp_size: int = DEFAULT_MAX_ILP_SIZE
    relax_steps: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        positive = (("time_limit_s", self.time_limit_s), ("greedy_time_s", self.greedy_time_s))
        for name, value in positive:
            if not _is_real(value) or not 0 < value <= 3600:
                raise PlanError(name, f"must be a number of seconds in (0, 3600], got "
                                      f"{value!r}")
        if not _is_real(self.balance_tolerance) or not 0 <= self.balance_tolerance <= 1:
            raise PlanError("balance_tolerance", f"must be in [0, 1], got "
                                                 f"{self.balance_tolerance!r}")
        if not _is_real(self.mip_rel_gap) or not 0 <= self.mip_rel_gap < 1:
            raise PlanError("mip_rel_gap", f"must be in [0, 1), got {self.mip_rel_gap!r}")
        for name in ("backward", "pin_diagonal"):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(name, f"must be True or False, got {getattr(self, name)!r}")
        for name, least in (("max_ilp_size", 0), ("relax_steps", 0), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise PlanError(name, f"must be an integer >= {least}, got {value!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


@dataclass(frozen=True)
class TilingResult:
    """A tiling: ``assignment`` maps every non-empty block (r, c) to its rank (empty when
    ``status`` is "infeasible"); ``objective`` is the bottleneck port in q-block units
    (`TilingProblem`), ``bound`` the solver's lower bound on it (None without one), and
    ``method`` says whose tiling it is ("ilp", "greedy" or "hierarchical")."""

    assignment: Mapping[tuple[int, int], int]
    status: str
    objective: float
    solve_s: float
    bound: float | None
    method: str
    work_cap: int
    balance_tolerance: float
    pin_diagonal: bool
    info: Mapping[str, object] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.status != "infeasible"


# --------------------------------------------------------------------------- the problem


@dataclass(frozen=True, eq=False)
class TilingProblem:
    """One tiling instance as arrays: the ILP's data.

    ``rows``, ``cols``, ``work``: the non-empty blocks ("tiles") and their elements;
    ``owners[i]``: the rank holding block i's q and kv (-1: held outside this group, as
    in a node's share of a hierarchical tiling); ``row_to[i]`` / ``row_from[i]``: units a
    rank computing in row i receives from / returns to its owner, ``col_to`` /
    ``col_from`` the same for kv column i; ``pinned[t]``: the rank tile t must go to, or
    -1; ``external_weight``: the factor on traffic with an owner outside the group.
    """

    rows: IntArray
    cols: IntArray
    work: IntArray
    owners: IntArray
    num_ranks: int
    row_to: FloatArray
    row_from: FloatArray
    col_to: FloatArray
    col_from: FloatArray
    work_cap: int
    pinned: IntArray
    external_weight: float = 1.0

    @property
    def num_blocks(self) -> int:
        return int(self.owners.shape[0])

    @property
    def num_tiles(self) -> int:
        return int(self.rows.shape[0])

    def loads(self, assign: IntArray) -> IntArray:
        """Work per rank of an assignment (tile -> rank)."""
        return np.bincount(assign, weights=self.work, minlength=self.num_ranks).astype(
            np.int64)

    def objective(self, assign: IntArray) -> float:
        inbound, outbound = problem_traffic(self, assign)
        return float(max(inbound.max(), outbound.max())) if self.num_ranks else 0.0

    def meets_cap(self, assign: IntArray) -> bool:
        return bool(self.loads(assign).max() <= self.work_cap) if self.num_tiles else True

    def honours_pins(self, assign: IntArray) -> bool:
        pin = self.pinned >= 0
        return bool(np.array_equal(assign[pin], self.pinned[pin]))


def _payload_units(shape: AttentionShape, grid: BlockGrid, kind: str) -> FloatArray:
    unit = shape.payload_bytes("q", grid.block_size)
    per_token = shape.payload_bytes(kind, 1)
    return grid.block_lens.astype(np.float64) * per_token / unit


def _coefficients(grid: BlockGrid, shape: AttentionShape, backward: bool
                  ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    row_to = _payload_units(shape, grid, "q")
    row_from = _payload_units(shape, grid, "out")
    col_to = _payload_units(shape, grid, "kv")
    col_from = np.zeros(grid.num_blocks)
    if backward:
        row_to = row_to + _payload_units(shape, grid, "q_bwd")
        row_from = row_from + _payload_units(shape, grid, "dq")
        col_to = col_to * 2.0
        col_from = _payload_units(shape, grid, "dkv")
    return row_to, row_from, col_to, col_from


def _work_cap(total: int, num_ranks: int, tolerance: float) -> int:
    return int(math.floor((1.0 + tolerance) * math.ceil(total / num_ranks) + 1e-9))


def tiling_problem(grid: BlockGrid, layout: Layout, shape: AttentionShape,
                   config: TilingConfig) -> TilingProblem:
    """The ILP data of tiling ``grid`` over ``layout``'s ranks (see `TilingProblem`)."""
    if layout.num_blocks != grid.num_blocks:
        raise PlanError("layout", f"has {layout.num_blocks} blocks, the grid "
                                  f"{grid.num_blocks}; they must match")
    rows, cols = (a.astype(np.int64) for a in np.nonzero(grid.kinds != EMPTY))
    work = grid.counts[rows, cols].astype(np.int64)
    owners = np.asarray(layout.owners, dtype=np.int64)
    row_to, row_from, col_to, col_from = _coefficients(grid, shape, config.backward)
    pinned = np.where((rows == cols) & config.pin_diagonal, owners[rows], -1)
    return TilingProblem(rows=rows, cols=cols, work=work, owners=owners,
                         num_ranks=layout.num_ranks, row_to=row_to, row_from=row_from,
                         col_to=col_to, col_from=col_from,
                         work_cap=_work_cap(int(work.sum()), layout.num_ranks,
                                            config.balance_tolerance),
                         pinned=pinned.astype(np.int64))


def _line_traffic(problem: TilingProblem, held: npt.NDArray[np.bool_], to: FloatArray,
                  back: FloatArray, inbound: FloatArray, outbound: FloatArray) -> None:
    """Adds the traffic of ``held[g, i]`` (rank g needs line i) to inbound/outbound."""
    owner = problem.owners
    remote = held & (owner[None, :] != np.arange(problem.num_ranks)[:, None])
    weight = np.where(owner < 0, problem.external_weight, 1.0)
    inbound += remote @ (to * weight)
    outbound += remote @ (back * weight)
    fetchers = remote.sum(axis=0)
    inside = owner >= 0
    inbound += np.bincount(owner[inside], weights=(fetchers * back)[inside],
                           minlength=problem.num_ranks)
    outbound += np.bincount(owner[inside], weights=(fetchers * to)[inside],
                            minlength=problem.num_ranks)


def problem_traffic(problem: TilingProblem, assign: IntArray,
                    tiles: IntArray | None = None) -> tuple[FloatArray, FloatArray]:
    """Units in and out of every rank when tile t runs on ``assign[t]`` (only the tiles
    ``tiles`` when given): the §2.3 terms evaluated, not relaxed."""
    g_count, p = problem.num_ranks, problem.num_blocks
    inbound = np.zeros(g_count)
    outbound = np.zeros(g_count)
    sel = np.arange(problem.num_tiles) if tiles is None else tiles
    for ids, to, back in ((problem.rows, problem.row_to, problem.row_from),
                          (problem.cols, problem.col_to, problem.col_from)):
        held = np.zeros((g_count, p), dtype=bool)
        held[assign[sel], ids[sel]] = True
        _line_traffic(problem, held, to, back, inbound, outbound)
    return inbound, outbound


def _score(problem: TilingProblem, assign: IntArray) -> tuple[float, float]:
    """(bottleneck port, sum of squared ports): the second breaks the first's plateaus."""
    inbound, outbound = problem_traffic(problem, assign)
    ports = np.maximum(inbound, outbound)
    return float(ports.max()), float((ports * ports).sum())


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    tol = _REL_EPS * max(1.0, abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    return a[0] <= b[0] + tol and a[1] < b[1] - _REL_EPS * max(1.0, abs(b[1]))


# ------------------------------------------------------------------------------ the ILP


@dataclass(frozen=True)
class _MilpOutcome:
    assign: IntArray | None
    status: str  # "optimal", "time_limit", "infeasible" (within the cutoff, if any)
    bound: float | None
    solve_s: float


def _solve_milp(problem: TilingProblem, assign: IntArray, ranks: IntArray, *,
                time_limit_s: float, mip_rel_gap: float, cutoff: float | None,
                tie: float, free: IntArray | None = None) -> _MilpOutcome:
    """The §2.3 ILP over the tiles now on ``ranks`` (pins excepted; only those in ``free``
    when given), which may move among ``ranks``; every other tile stays where ``assign``
    has it. With ``ranks`` = all ranks this is the whole ILP. ``cutoff``: only tilings
    whose bottleneck is at most it. ``tie`` weighs the total traffic of the free part, to
    break ties in a neighbourhood."""
    g_count, p = problem.num_ranks, problem.num_blocks
    owner = problem.owners
    k = int(ranks.size)
    in_group = np.zeros(g_count, dtype=bool)
    in_group[ranks] = True
    free_mask = in_group[assign] & (problem.pinned < 0)
    if free is not None:
        chosen = np.zeros(problem.num_tiles, dtype=bool)
        chosen[free] = True
        free_mask &= chosen
    free = np.flatnonzero(free_mask)
    fixed = np.flatnonzero(~free_mask)
    base_in, base_out = problem_traffic(problem, assign, fixed)
    base_load = np.bincount(assign[fixed], weights=problem.work[fixed], minlength=g_count)
    num_free = int(free.size)
    num_x = num_free * k
    x_of = np.arange(num_x, dtype=np.int64).reshape(num_free, k)
    next_var = num_x
    tables = []
    for ids in (problem.rows, problem.cols):
        used = np.zeros(p, dtype=bool)
        used[ids[free]] = True
        held = np.zeros((g_count, p), dtype=bool)
        held[assign[fixed], ids[fixed]] = True
        # a variable for (rank, line) only where the free tiles may create the need
        need = used[None, :] & (owner[None, :] != ranks[:, None]) & ~held[ranks]
        table = np.full((k, p), -1, dtype=np.int64)
        count = int(need.sum())
        table[need] = np.arange(next_var, next_var + count)
        next_var += count
        tables.append(table)
    t_var = next_var
    num_vars = next_var + 1

    rows_: list[IntArray] = []
    cols_: list[IntArray] = []
    vals: list[FloatArray] = []
    lows: list[FloatArray] = []
    highs: list[FloatArray] = []
    offset = 0

    def add(r: IntArray, c: IntArray, v: FloatArray, lo: FloatArray, hi: FloatArray) -> None:
        nonlocal offset
        rows_.append(r + offset)
        cols_.append(c)
        vals.append(v)
        lows.append(lo)
        highs.append(hi)
        offset += int(lo.shape[0])

    # each free tile on exactly one rank of the group
    add(np.repeat(np.arange(num_free, dtype=np.int64), k), x_of.ravel(), np.ones(num_x),
        np.ones(num_free), np.ones(num_free))
    # x[t, g] <= H[g, row of t] and <= V[g, col of t]
    for ids, table in zip((problem.rows, problem.cols), tables):
        need = table[:, ids[free]].T
        sel = need >= 0
        m = int(sel.sum())
        r = np.arange(m, dtype=np.int64)
        add(np.concatenate([r, r]), np.concatenate([x_of[sel], need[sel]]),
            np.concatenate([np.ones(m), -np.ones(m)]), np.full(m, -np.inf), np.zeros(m))
    # the work cap, in units of the largest tile (HiGHS wants rows near 1)
    scale = float(max(1, int(problem.work.max()) if problem.num_tiles else 1))
    add(np.tile(np.arange(k, dtype=np.int64), num_free), x_of.ravel(),
        np.repeat(problem.work[free] / scale, k), np.full(k, -np.inf),
        (problem.work_cap - base_load[ranks]) / scale)
    # ports: in_g + ... <= T (row g), out_g + ... <= T (row g + G), for the ranks touched
    cost = np.zeros(num_vars)
    port_rows: list[IntArray] = []
    port_cols: list[IntArray] = []
    port_vals: list[FloatArray] = []
    for table, to, back in zip(tables, (problem.row_to, problem.col_to),
                               (problem.row_from, problem.col_from)):
        qq, ii = np.nonzero(table >= 0)
        var = table[qq, ii]
        g = ranks[qq]
        weight = np.where(owner[ii] < 0, problem.external_weight, 1.0)
        port_rows += [g, g + g_count]
        port_cols += [var, var]
        port_vals += [to[ii] * weight, back[ii] * weight]
        own = owner[ii]
        inside = own >= 0
        port_rows += [own[inside], own[inside] + g_count]
        port_cols += [var[inside], var[inside]]
        port_vals += [back[ii][inside], to[ii][inside]]
        cost[var] += tie * (to[ii] + back[ii]) * weight
    all_rows = np.concatenate(port_rows) if port_rows else np.zeros(0, dtype=np.int64)
    touched = np.zeros(2 * g_count, dtype=bool)
    touched[all_rows] = True
    touched[ranks] = True
    touched[ranks + g_count] = True
    port_of = np.flatnonzero(touched)
    remap = np.full(2 * g_count, -1, dtype=np.int64)
    remap[port_of] = np.arange(port_of.size)
    base = np.concatenate([base_in, base_out])
    add(np.concatenate([remap[all_rows], np.arange(port_of.size, dtype=np.int64)]),
        np.concatenate([*port_cols, np.full(port_of.size, t_var, dtype=np.int64)]),
        np.concatenate([*port_vals, -np.ones(port_of.size)]),
        np.full(port_of.size, -np.inf), -base[port_of])

    matrix = sp.csr_array((np.concatenate(vals), (np.concatenate(rows_),
                                                   np.concatenate(cols_))),
                          shape=(offset, num_vars))
    lower = np.zeros(num_vars)
    upper = np.ones(num_vars)
    upper[t_var] = np.inf if cutoff is None else cutoff
    integrality = np.ones(num_vars)
    integrality[t_var] = 0
    cost[t_var] = 1.0
    start = time.perf_counter()
    result = milp(cost, integrality=integrality, bounds=Bounds(lower, upper),
                  constraints=LinearConstraint(matrix, np.concatenate(lows),
                                               np.concatenate(highs)),
                  options={"time_limit": float(time_limit_s), "mip_rel_gap": mip_rel_gap})
    solve_s = time.perf_counter() - start
    raw_bound = getattr(result, "mip_dual_bound", None)
    bound = float(raw_bound) if raw_bound is not None and np.isfinite(raw_bound) else None
    if result.x is None:
        # status 2: infeasible (within the cutoff); otherwise nothing found in the time
        return _MilpOutcome(None, "infeasible" if result.status == 2 else "time_limit",
                            bound, solve_s)
    x = np.asarray(result.x[:num_x]).reshape(num_free, k)
    new = assign.copy()
    new[free] = ranks[np.argmax(x, axis=1)]
    return _MilpOutcome(new, "optimal" if result.status == 0 else "time_limit", bound,
                        solve_s)


def ilp_assignment(problem: TilingProblem, *, time_limit_s: float, mip_rel_gap: float = 1e-4,
                   cutoff: float | None = None) -> tuple[IntArray | None, str, float | None]:
    """The whole ILP of ``problem``: (tile -> rank or None, status, lower bound)."""
    start = np.where(problem.pinned >= 0, problem.pinned, 0).astype(np.int64)
    out = _solve_milp(problem, start, np.arange(problem.num_ranks, dtype=np.int64),
                      time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap, cutoff=cutoff,
                      tie=0.0)
    return out.assign, out.status, out.bound


# --------------------------------------------------------------------------- the greedy


class _State:
    """An assignment with per-(rank, line) counts, so that moving a tile updates the ports
    of the (at most four) ranks it touches in constant time."""

    def __init__(self, problem: TilingProblem, assign: IntArray) -> None:
        g_count, p = problem.num_ranks, problem.num_blocks
        self.problem = problem
        self.assign: IntArray = assign.astype(np.int64).copy()
        self.hc = np.zeros((g_count, p), dtype=np.int64)
        self.vc = np.zeros((g_count, p), dtype=np.int64)
        np.add.at(self.hc, (self.assign, problem.rows), 1)
        np.add.at(self.vc, (self.assign, problem.cols), 1)
        self.load = problem.loads(self.assign)
        inbound, outbound = problem_traffic(problem, self.assign)
        self.inb, self.outb = inbound, outbound
        self.owner: list[int] = problem.owners.tolist()
        self.weight: list[float] = np.where(problem.owners < 0, problem.external_weight,
                                            1.0).tolist()
        self.rt: list[float] = problem.row_to.tolist()
        self.rf: list[float] = problem.row_from.tolist()
        self.ct: list[float] = problem.col_to.tolist()
        self.cf: list[float] = problem.col_from.tolist()
        self.rows: list[int] = problem.rows.tolist()
        self.cols: list[int] = problem.cols.tolist()
        self.work: list[int] = problem.work.tolist()

    def _line(self, g: int, i: int, sign: int, to: list[float], back: list[float]) -> None:
        o = self.owner[i]
        if o == g:
            return
        w = self.weight[i]
        self.inb[g] += sign * to[i] * w
        self.outb[g] += sign * back[i] * w
        if o >= 0:
            self.outb[o] += sign * to[i]
            self.inb[o] += sign * back[i]

    def move(self, t: int, b: int) -> None:
        a = int(self.assign[t])
        if a == b:
            return
        r, c = self.rows[t], self.cols[t]
        hc, vc = self.hc, self.vc
        hc[a, r] -= 1
        if hc[a, r] == 0:
            self._line(a, r, -1, self.rt, self.rf)
        if hc[b, r] == 0:
            self._line(b, r, 1, self.rt, self.rf)
        hc[b, r] += 1
        vc[a, c] -= 1
        if vc[a, c] == 0:
            self._line(a, c, -1, self.ct, self.cf)
        if vc[b, c] == 0:
            self._line(b, c, 1, self.ct, self.cf)
        vc[b, c] += 1
        self.load[a] -= self.work[t]
        self.load[b] += self.work[t]
        self.assign[t] = b

    def score(self) -> tuple[float, float]:
        ports = np.maximum(self.inb, self.outb)
        return float(ports.max()), float((ports * ports).sum())

    def try_move(self, tiles: Sequence[int], b: int) -> tuple[float, float]:
        """The score after moving ``tiles`` (all on one rank) to ``b``, undone."""
        a = int(self.assign[tiles[0]])
        for t in tiles:
            self.move(t, b)
        s = self.score()
        for t in tiles:
            self.move(t, a)
        return s


def _line_index(ids: IntArray, size: int) -> list[IntArray]:
    order = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[order], np.arange(size + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(size)]


def _local_search(problem: TilingProblem, assign: IntArray, *, deadline: float,
                  rng: np.random.Generator) -> IntArray:
    """First-improvement descent on (bottleneck, sum of squared ports) over moves of one
    tile, or of all of a rank's tiles in one row or one column, to a rank that already
    needs that row or column (or owns it), within the work cap."""
    state = _State(problem, assign)
    cap = problem.work_cap
    movable = np.flatnonzero(problem.pinned < 0)
    if movable.size == 0:
        return state.assign
    movable_mask = problem.pinned < 0
    by_row = _line_index(problem.rows, problem.num_blocks)
    by_col = _line_index(problem.cols, problem.num_blocks)
    best = state.score()
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for t in rng.permutation(movable).tolist():
            if time.perf_counter() > deadline:
                break
            a = int(state.assign[t])
            r, c = state.rows[t], state.cols[t]
            targets = set(np.flatnonzero(state.hc[:, r]).tolist())
            targets.update(np.flatnonzero(state.vc[:, c]).tolist())
            targets.update(o for o in (state.owner[r], state.owner[c]) if o >= 0)
            targets.discard(a)
            if not targets:
                continue
            in_row = by_row[r][(state.assign[by_row[r]] == a) & movable_mask[by_row[r]]]
            in_col = by_col[c][(state.assign[by_col[c]] == a) & movable_mask[by_col[c]]]
            groups = [[t]]
            for seg in (in_row, in_col):
                if seg.size > 1:
                    groups.append(seg.tolist())
            weights = [sum(state.work[u] for u in g) for g in groups]
            choice: tuple[int, list[int]] | None = None
            for b in targets:
                for g, w in zip(groups, weights):
                    if state.load[b] + w > cap:
                        continue
                    s = state.try_move(g, b)
                    if _better(s, best):
                        best, choice = s, (b, g)
            if choice is not None:
                for u in choice[1]:
                    state.move(u, choice[0])
                best = state.score()
                improved = True
    return state.assign


def _repair(problem: TilingProblem, assign: IntArray, deadline: float) -> IntArray:
    """Moves tiles off ranks over the work cap, each to where it costs least."""
    state = _State(problem, assign)
    cap = problem.work_cap
    movable = problem.pinned < 0
    while time.perf_counter() < deadline:
        over = np.flatnonzero(state.load > cap)
        if over.size == 0:
            break
        a = int(over[np.argmax(state.load[over])])
        tiles = np.flatnonzero((state.assign == a) & movable)
        if tiles.size == 0:
            break
        excess = state.load[a] - cap
        # the smallest tiles that clear the excess alone, else the largest
        fits = tiles[problem.work[tiles] >= excess]
        pool = fits[np.argsort(problem.work[fits])[:8]] if fits.size else \
            tiles[np.argsort(-problem.work[tiles])[:8]]
        best: tuple[tuple[float, float], int, int] | None = None
        for t in pool.tolist():
            w = state.work[t]
            room = np.flatnonzero(state.load + w <= cap)
            if room.size > 16:
                # the ranks already needing the tile's row or column, then the lightest
                near = np.flatnonzero((state.hc[:, state.rows[t]] > 0)
                                      | (state.vc[:, state.cols[t]] > 0))
                near = np.intersect1d(near, room)
                light = room[np.argsort(state.load[room])[:8]]
                room = np.union1d(near[:8], light)
            for b in room.tolist():
                s = state.try_move([t], b)
                if best is None or s < best[0]:
                    best = (s, t, b)
        if best is None:
            break
        state.move(best[1], best[2])
    return state.assign


def _mip_repair(problem: TilingProblem, assign: IntArray, *, deadline: float,
                mip_rel_gap: float) -> IntArray:
    """Brings ranks over the work cap under it by re-solving exactly (`_solve_milp`) the
    tiles of the most loaded rank together with those of one or two ranks with room: the
    moved tiles go where they cost least as a group, which moving them one at a time
    cannot see."""
    if problem.num_ranks < 2:
        return assign
    for _ in range(4 * problem.num_ranks):
        loads = problem.loads(assign)
        over = np.flatnonzero(loads > problem.work_cap)
        if over.size == 0 or time.perf_counter() >= deadline:
            break
        a = int(over[np.argmax(loads[over])])
        room = [int(b) for b in np.argsort(loads, kind="stable") if b != a]
        groups = [(a, b) for b in room[:3]] + [(a, room[0], room[1])] if len(room) > 1 \
            else [(a, room[0])]
        fixed = False
        for group in groups:
            left = deadline - time.perf_counter()
            if left <= 0.005:
                break
            ranks = np.array(sorted(group), dtype=np.int64)
            tiles = np.flatnonzero(np.isin(assign, ranks) & (problem.pinned < 0))
            if tiles.size > _LNS_MAX_FREE:
                break
            out = _solve_milp(problem, assign, ranks, time_limit_s=left,
                              mip_rel_gap=mip_rel_gap, cutoff=None, tie=1e-3, free=tiles)
            if out.assign is not None and \
                    (problem.loads(out.assign)[ranks] <= problem.work_cap).all():
                assign, fixed = out.assign, True
                break
        if not fixed:
            break
    return assign


def _bisection(problem: TilingProblem) -> IntArray:
    """Recursive bisection of the tiles into ``num_ranks`` parts of equal work, cutting
    across the longer side each time (compact, nearly square parts: few rows and columns
    per part), then mapped to ranks to maximise the rows and columns a rank owns."""
    n, g_count = problem.num_tiles, problem.num_ranks
    labels = np.zeros(n, dtype=np.int64)
    rows, cols, work = problem.rows, problem.cols, problem.work
    stack: list[tuple[IntArray, int, int]] = [(np.arange(n, dtype=np.int64), 0, g_count)]
    while stack:
        idx, lo, hi = stack.pop()
        if hi - lo == 1 or idx.size <= 1:
            labels[idx] = lo
            continue
        k1 = (hi - lo) // 2
        rr, cc = rows[idx], cols[idx]
        if rr.max() - rr.min() >= cc.max() - cc.min():
            order = np.lexsort((cc, rr))
        else:
            order = np.lexsort((rr, cc))
        cum = np.cumsum(work[idx[order]])
        split = int(np.searchsorted(cum, cum[-1] * k1 / (hi - lo)))
        split = min(max(split + 1, 1), idx.size - 1)
        stack.append((idx[order[:split]], lo, lo + k1))
        stack.append((idx[order[split:]], lo + k1, hi))
    owner = problem.owners
    inside = np.flatnonzero(owner >= 0)
    gain = np.zeros((g_count, g_count))
    for ids, to, back in ((rows, problem.row_to, problem.row_from),
                          (cols, problem.col_to, problem.col_from)):
        held = sp.csr_array((np.ones(n), (labels, ids)),
                            shape=(g_count, problem.num_blocks))
        held.data[:] = 1.0
        owned = sp.csr_array(((to + back)[inside], (inside, owner[inside])),
                             shape=(problem.num_blocks, g_count))
        gain += (held @ owned).toarray()
    pin = problem.pinned >= 0
    if pin.any():
        # a part holding a pinned tile leans towards the pinned rank
        np.add.at(gain, (labels[pin], problem.pinned[pin]), float(gain.max() + 1.0))
    part, rank = linear_sum_assignment(gain, maximize=True)
    mapping = np.empty(g_count, dtype=np.int64)
    mapping[part] = rank
    out = mapping[labels]
    out[pin] = problem.pinned[pin]
    return out


def _coarse_seed(problem: TilingProblem, *, time_limit_s: float, mip_rel_gap: float
                 ) -> IntArray | None:
    """The ILP over owner tiles: all tiles whose row and column have the same owners move
    together (a contiguous layout's CP x CP super-blocks), each needing all its owner's
    rows and columns; the cap is loosened by half the largest owner tile, for the repair to
    settle at tile level. Small (CP^2 x CP variables at most), so it is solved in a moment,
    and its optimal tiling is the coarse shape the paper's ILP solutions have."""
    g_count = problem.num_ranks
    # owner groups: rank g's lines are group g, lines held outside are group g_count
    group_of_line = np.where(problem.owners >= 0, problem.owners, g_count)
    num_groups = g_count + 1
    key = group_of_line[problem.rows] * num_groups + group_of_line[problem.cols]
    tiles_key, inverse = np.unique(key, return_inverse=True)
    if tiles_key.size >= problem.num_tiles:
        return None  # nothing to coarsen
    work = np.bincount(inverse, weights=problem.work).astype(np.int64)
    lines = [np.bincount(group_of_line, weights=v, minlength=num_groups).astype(np.float64)
             for v in (problem.row_to, problem.row_from, problem.col_to, problem.col_from)]
    owners = np.arange(num_groups, dtype=np.int64)
    owners[g_count] = -1
    pinned_tile = np.full(tiles_key.size, -1, dtype=np.int64)
    pin = problem.pinned >= 0
    pinned_tile[inverse[pin]] = problem.pinned[pin]
    coarse = TilingProblem(
        rows=tiles_key // num_groups, cols=tiles_key % num_groups, work=work, owners=owners,
        num_ranks=g_count, row_to=lines[0], row_from=lines[1], col_to=lines[2],
        col_from=lines[3], work_cap=int(problem.work_cap + work.max() // 2),
        pinned=pinned_tile, external_weight=problem.external_weight)
    if _quick_infeasible(coarse):
        return None
    assign, _, _ = ilp_assignment(coarse, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap)
    if assign is None:
        return None
    return assign[inverse]


def _neighbourhood_search(problem: TilingProblem, assign: IntArray, *, deadline: float,
                          rng: np.random.Generator, mip_rel_gap: float,
                          sub_limit_s: float) -> IntArray:
    """Re-solves exactly the tiles of the bottleneck rank and one other rank at a time
    (a large-neighbourhood search with the ILP of `_solve_milp`), until no pair improves
    or time runs out."""
    if problem.num_ranks < 2:
        return assign
    best = _score(problem, assign)
    tried: set[tuple[int, int]] = set()
    while time.perf_counter() < deadline:
        inbound, outbound = problem_traffic(problem, assign)
        ports = np.maximum(inbound, outbound)
        a = int(np.argmax(ports))
        # partners: the ranks trading with a first (owners of its lines, needers of its)
        partners = [int(b) for b in np.argsort(ports, kind="stable") if b != a]
        rng.shuffle(partners)
        pair = next(((a, b) for b in partners if (min(a, b), max(a, b)) not in tried), None)
        if pair is None:
            break
        tried.add((min(pair), max(pair)))
        left = deadline - time.perf_counter()
        if left <= 0.005:
            break
        tiles = np.flatnonzero(np.isin(assign, pair) & (problem.pinned < 0))
        if tiles.size > _LNS_MAX_FREE:
            # HiGHS's root cuts ignore the time limit on big neighbourhoods: re-solve a
            # window of consecutive rows of the pair's tiles only
            tiles = tiles[np.lexsort((problem.cols[tiles], problem.rows[tiles]))]
            first = int(rng.integers(0, tiles.size - _LNS_MAX_FREE + 1))
            tiles = tiles[first:first + _LNS_MAX_FREE]
        out = _solve_milp(problem, assign, np.array(sorted(pair), dtype=np.int64),
                          time_limit_s=min(left, sub_limit_s), mip_rel_gap=mip_rel_gap,
                          cutoff=None, tie=1e-3, free=tiles)
        if out.assign is None or not problem.meets_cap(out.assign):
            continue
        s = _score(problem, out.assign)
        if _better(s, best):
            assign, best = out.assign, s
            tried.clear()
    return assign


def _balance_polish(problem: TilingProblem, assign: IntArray, *, deadline: float) -> IntArray:
    """Lowers the busiest rank's work by moving single tiles off it, never raising the
    bottleneck port: the ILP's objective has no term for work below the cap, and the
    estimate pays for the busiest rank's compute. A move to a rank that already needs (or
    owns) the tile's row and column changes no port at all, so those come first; others
    are evaluated, a few at a time."""
    state = _State(problem, assign)
    limit = state.score()[0] * (1 + _REL_EPS) + _REL_EPS
    movable = problem.pinned < 0
    ranks = np.arange(problem.num_ranks)[:, None]
    owners = problem.owners
    while time.perf_counter() < deadline:
        a = int(np.argmax(state.load))
        tiles = np.flatnonzero((state.assign == a) & movable)
        if tiles.size == 0:
            break
        rr, cc = problem.rows[tiles], problem.cols[tiles]
        fits = state.load[:, None] + problem.work[tiles][None, :] < state.load[a]
        fits[a] = False
        free = fits & ((state.hc[:, rr] > 0) | (owners[rr][None, :] == ranks)) & \
            ((state.vc[:, cc] > 0) | (owners[cc][None, :] == ranks))
        if free.any():
            b, j = np.nonzero(free)
            k = int(np.argmin(state.load[b] + problem.work[tiles[j]]))
            state.move(int(tiles[j[k]]), int(b[k]))
            continue
        b, j = np.nonzero(fits)
        if b.size == 0:
            break
        # the lightest targets first
        order = np.argsort(state.load[b], kind="stable")[:32]
        best: tuple[tuple[float, float], int, int] | None = None
        for k in order.tolist():
            t, target = int(tiles[j[k]]), int(b[k])
            s = state.try_move([t], target)
            if s[0] <= limit and (best is None or s < best[0]):
                best = (s, t, target)
        if best is None:
            break
        state.move(best[1], best[2])
    return state.assign


def greedy_assignment(problem: TilingProblem, *, time_s: float, seed: int = 0,
                      mip_rel_gap: float = 1e-4) -> IntArray:
    """The greedy's tiling of ``problem`` (tile -> rank) in about ``time_s`` seconds; it
    meets the work cap whenever its repair finds a way (check `TilingProblem.meets_cap`)."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    deadline = start + time_s
    pin = problem.pinned >= 0
    seeds: list[IntArray] = []
    if problem.num_tiles == 0:
        return np.zeros(0, dtype=np.int64)
    if (problem.owners >= 0).all():
        for owned in (problem.owners[problem.rows], problem.owners[problem.cols]):
            # an owner-computes seed far over the cap costs a long repair on a big grid
            if problem.num_tiles <= _SMALL_TILES or \
                    problem.loads(owned).max() <= 1.5 * problem.work_cap:
                seeds.append(owned.copy())
    seeds.append(_bisection(problem))
    if problem.num_ranks ** 3 <= _MAX_COARSE_VARIABLES:
        coarse = _coarse_seed(problem, time_limit_s=time_s / 6, mip_rel_gap=mip_rel_gap)
        if coarse is not None:
            seeds.insert(0, coarse)
    # a third of the time for the seeds' descents, the rest for the exact neighbourhoods
    descent_end = start + time_s / 3
    best: tuple[tuple[bool, float, float], IntArray] | None = None
    for i, assign in enumerate(seeds):
        assign[pin] = problem.pinned[pin]
        share = max(0.0, (descent_end - time.perf_counter()) / (len(seeds) - i))
        if not problem.meets_cap(assign):
            # a repair is never starved of time: a seed over the cap is worth nothing
            repair_s = max(share / 2, _MIN_REPAIR_S)
            assign = _mip_repair(problem, assign, deadline=time.perf_counter() + repair_s,
                                 mip_rel_gap=mip_rel_gap)
            assign = _repair(problem, assign, time.perf_counter() + repair_s)
        assign = _local_search(problem, assign, deadline=time.perf_counter() + share / 2,
                               rng=rng)
        s = _score(problem, assign)
        key = (not problem.meets_cap(assign), s[0], s[1])
        if best is None or key < best[0]:
            best = (key, assign)
    assert best is not None
    assign = best[1]
    if not problem.meets_cap(assign):
        repair_s = max(deadline - time.perf_counter(), 3 * _MIN_REPAIR_S)
        assign = _mip_repair(problem, assign, deadline=time.perf_counter() + repair_s,
                             mip_rel_gap=mip_rel_gap)
        assign = _repair(problem, assign, time.perf_counter() + repair_s)
    if problem.meets_cap(assign):
        assign = _neighbourhood_search(problem, assign, deadline=deadline, rng=rng,
                                       mip_rel_gap=mip_rel_gap,
                                       sub_limit_s=max(0.02, time_s / 4))
        assign = _local_search(problem, assign, deadline=deadline + 0.05 * time_s, rng=rng)
        assign = _balance_polish(problem, assign, deadline=deadline + 0.1 * time_s)
    return assign


# ------------------------------------------------------------------- the public tilers


def _result(problem: TilingProblem, rows: IntArray, cols: IntArray, assign: IntArray | None,
            *, status: str, solve_s: float, bound: float | None, method: str,
            config: TilingConfig, info: Mapping[str, object] | None = None) -> TilingResult:
    if assign is None or status == "infeasible":
        return TilingResult({}, "infeasible", math.inf, solve_s, bound, method,
                            problem.work_cap, config.balance_tolerance, config.pin_diagonal,
                            dict(info or {}))
    assignment = dict(zip(zip(rows.tolist(), cols.tolist()), assign.tolist()))
    return TilingResult(assignment, status, problem.objective(assign), solve_s, bound,
                        method, problem.work_cap, config.balance_tolerance,
                        config.pin_diagonal, dict(info or {}))


def _quick_infeasible(problem: TilingProblem) -> bool:
    """True when the cap cannot be met: a pinned load or a single tile exceeds it."""
    if problem.num_tiles == 0:
        return False
    pin = problem.pinned >= 0
    pinned_load = np.bincount(problem.pinned[pin], weights=problem.work[pin],
                              minlength=problem.num_ranks)
    return bool(pinned_load.max() > problem.work_cap or problem.work.max() > problem.work_cap)


def _cutoff(value: float) -> float:
    """Strictly below ``value`` by more than HiGHS's feasibility tolerance (1e-6)."""
    return value - max(1e-4, _REL_EPS * abs(value))


def _ilp_with_warm_greedy(problem: TilingProblem, config: TilingConfig, *,
                          search_s: float | None = None
                          ) -> tuple[IntArray | None, str, float | None, str, float]:
    """(assign, status, bound, method, seconds) of the greedy-then-ILP search; when the
    greedy finds no tiling within the cap, the ILP looks for one for ``search_s`` seconds
    (default: the rest of the time limit)."""
    start = time.perf_counter()
    if _quick_infeasible(problem):
        return None, "infeasible", None, "ilp", time.perf_counter() - start
    greedy_s = min(config.greedy_time_s, config.time_limit_s / 3)
    incumbent = greedy_assignment(problem, time_s=greedy_s, seed=config.seed,
                                  mip_rel_gap=config.mip_rel_gap)
    have = problem.meets_cap(incumbent)
    value = problem.objective(incumbent) if have else math.inf
    left = max(0.05, config.time_limit_s - (time.perf_counter() - start))
    if not have and search_s is not None:
        left = min(left, search_s)
    assign, status, bound = ilp_assignment(problem, time_limit_s=left,
                                           mip_rel_gap=config.mip_rel_gap,
                                           cutoff=_cutoff(value) if have else None)
    usable = assign is not None and problem.meets_cap(assign) and \
        problem.honours_pins(assign)
    if usable and assign is not None and problem.objective(assign) <= _cutoff(value):
        assign = _balance_polish(problem, assign, deadline=time.perf_counter()
                                 + 0.1 * config.greedy_time_s)
        return assign, status, bound, "ilp", time.perf_counter() - start
    if not have:
        return None, "infeasible" if status == "infeasible" else "time_limit", bound, \
            "ilp", time.perf_counter() - start
    # the cutoff is infeasible (nothing beats the greedy: proven optimal), the ILP's best
    # ties with it, or nothing was found in time
    proven = status == "infeasible" or (usable and status == "optimal")
    return incumbent, "optimal" if proven else "time_limit", bound, "greedy", \
        time.perf_counter() - start


def tile2d_ilp(grid: BlockGrid, layout: Layout, shape: AttentionShape,
               config: TilingConfig | None = None) -> TilingResult:
    """The §2.3 ILP (HiGHS via ``scipy.optimize.milp``), with the greedy's tiling as the
    cutoff: status "optimal" (proven; ``method`` "greedy" when the ILP proved that nothing
    beats the greedy), "time_limit" (the best found in ``config.time_limit_s``) or
    "infeasible" (no tiling meets the work cap: empty assignment)."""
    config = config or TilingConfig()
    problem = tiling_problem(grid, layout, shape, config)
    assign, status, bound, method, seconds = _ilp_with_warm_greedy(problem, config)
    if assign is None and status != "infeasible":
        status = "infeasible"  # nothing feasible found: cannot vouch for any tiling
    return _result(problem, problem.rows, problem.cols, assign, status=status,
                   solve_s=seconds, bound=bound, method=method, config=config,
                   info={"layout": layout.kind})


def tile2d_greedy(grid: BlockGrid, layout: Layout, shape: AttentionShape,
                  config: TilingConfig | None = None) -> TilingResult:
    """The greedy's tiling in about ``config.greedy_time_s`` seconds: status "heuristic",
    or "infeasible" (empty assignment) when it cannot meet the work cap."""
    config = config or TilingConfig()
    problem = tiling_problem(grid, layout, shape, config)
    start = time.perf_counter()
    if _quick_infeasible(problem):
        return _result(problem, problem.rows, problem.cols, None, status="infeasible",
                       solve_s=time.perf_counter() - start, bound=None, method="greedy",
                       config=config, info={"layout": layout.kind})
    assign = greedy_assignment(problem, time_s=config.greedy_time_s, seed=config.seed,
                               mip_rel_gap=config.mip_rel_gap)
    status = "heuristic" if problem.meets_cap(assign) else "infeasible"
    return _result(problem, problem.rows, problem.cols, assign, status=status,
                   solve_s=time.perf_counter() - start, bound=None, method="greedy",
                   config=config, info={"layout": layout.kind})


def _solve(problem: TilingProblem, config: TilingConfig, use_ilp: bool, *,
           search_s: float | None = None
           ) -> tuple[IntArray | None, str, float | None, str, float]:
    """ILP (with the greedy's cutoff) or greedy alone: (assign, status, bound, method, s)."""
    if use_ilp:
        return _ilp_with_warm_greedy(problem, config, search_s=search_s)
    start = time.perf_counter()
    if _quick_infeasible(problem):
        return None, "infeasible", None, "greedy", time.perf_counter() - start
    assign = greedy_assignment(problem, time_s=config.greedy_time_s, seed=config.seed,
                               mip_rel_gap=config.mip_rel_gap)
    if not problem.meets_cap(assign):
        return None, "infeasible", None, "greedy", time.perf_counter() - start
    return assign, "heuristic", None, "greedy", time.perf_counter() - start


def _intra_over_inter(topology: Topology) -> float:
    """How many intra-node bytes cost as much as one inter-node byte."""
    return topology.intra_node.bandwidth_Bps / topology.inter_node.bandwidth_Bps


_STATUS_RANK = {s: i for i, s in enumerate(("optimal", "heuristic", "time_limit",
                                             "infeasible"))}


def hierarchical_tiling(grid: BlockGrid, layout: Layout, shape: AttentionShape, *,
                        ranks_per_node: int, config: TilingConfig | None = None,
                        topology: Topology | None = None) -> TilingResult:
    """Node-then-device tiling (§2.4): the grid over nodes first (a block's owner node is
    its owner's, ranks ``n * ranks_per_node ...`` forming node n), minimising bytes between
    nodes; then each node's blocks over its devices, where a payload from another node
    counts ``intra / inter`` bandwidth times its bytes (``topology``, default
    `furnace.runtime.presets.h100_ib` with ``ranks_per_node`` GPUs a node). The node
    level caps a node's work at half of tau over its share, the device level every
    device at the flat cap (so the result meets tau, and the device level has room);
    each level gets the ILP when small enough (``config.max_ilp_size``), else the greedy.
    ``objective`` is the flat bottleneck port of the result."""
    config = config or TilingConfig()
    num_ranks = layout.num_ranks
    if not isinstance(ranks_per_node, int) or isinstance(ranks_per_node, bool) or \
            ranks_per_node < 1 or num_ranks % ranks_per_node:
        raise PlanError("ranks_per_node", f"must be a positive divisor of the {num_ranks} "
                                          f"ranks, got {ranks_per_node!r}")
    topo = topology or h100_ib(gpus_per_node=ranks_per_node)
    start = time.perf_counter()
    flat = tiling_problem(grid, layout, shape, config)
    num_nodes = num_ranks // ranks_per_node
    if num_nodes == 1 or ranks_per_node == 1:
        use_ilp = flat.num_tiles * num_ranks <= config.max_ilp_size
        assign, status, bound, method, _ = _solve(flat, config, use_ilp)
        return _result(flat, flat.rows, flat.cols, assign, status=status,
                       solve_s=time.perf_counter() - start, bound=bound, method=method,
                       config=config, info={"layout": layout.kind, "levels": 1})
    half = dataclasses.replace(config, balance_tolerance=config.balance_tolerance / 2)
    node_owner = flat.owners // ranks_per_node
    node_problem = dataclasses.replace(
        flat, owners=node_owner, num_ranks=num_nodes,
        pinned=np.where(flat.pinned >= 0, flat.pinned // ranks_per_node, -1),
        work_cap=_work_cap(int(flat.work.sum()), num_nodes, half.balance_tolerance))
    node_assign, node_status, _, node_method, _ = _solve(
        node_problem, half, node_problem.num_tiles * num_nodes <= config.max_ilp_size)
    info: dict[str, object] = {"layout": layout.kind, "levels": 2,
                               "node_status": node_status, "node_method": node_method}
    if node_assign is None:
        return _result(flat, flat.rows, flat.cols, None, status="infeasible",
                       solve_s=time.perf_counter() - start, bound=None,
                       method="hierarchical", config=config, info=info)
    assign = np.zeros(flat.num_tiles, dtype=np.int64)
    statuses = [node_status]
    external = _intra_over_inter(topo)
    # the nodes share one level's time between them
    per_node = dataclasses.replace(
        half, time_limit_s=max(0.05, half.time_limit_s / num_nodes),
        greedy_time_s=max(0.02, half.greedy_time_s / num_nodes))
    for node in range(num_nodes):
        tiles = np.flatnonzero(node_assign == node)
        if tiles.size == 0:
            continue
        first = node * ranks_per_node
        home = node_owner == node
        local_owner = np.where(home, flat.owners - first, -1)
        local_pin = np.where(flat.pinned[tiles] >= 0,
                             flat.pinned[tiles] - first, -1)
        local_pin[(local_pin < 0) | (local_pin >= ranks_per_node)] = -1
        work = flat.work[tiles]
        sub = dataclasses.replace(
            flat, rows=flat.rows[tiles], cols=flat.cols[tiles], work=work,
            owners=local_owner, num_ranks=ranks_per_node, pinned=local_pin,
            external_weight=external, work_cap=flat.work_cap)
        sub_assign, sub_status, _, _, _ = _solve(
            sub, per_node, sub.num_tiles * ranks_per_node <= config.max_ilp_size)
        statuses.append(sub_status)
        if sub_assign is None:
            info["infeasible_node"] = node
            return _result(flat, flat.rows, flat.cols, None, status="infeasible",
                           solve_s=time.perf_counter() - start, bound=None,
                           method="hierarchical", config=config, info=info)
        assign[tiles] = sub_assign + first
    status = max(statuses, key=_STATUS_RANK.__getitem__)
    if status == "optimal":
        status = "heuristic"  # each level optimal is not the flat optimum
    return _result(flat, flat.rows, flat.cols, assign, status=status,
                   solve_s=time.perf_counter() - start, bound=None, method="hierarchical",
                   config=config, info=info)


# ------------------------------------------------------------------ the time estimate

_SRC, _DST, _KIND, _BLOCK = (attrgetter(name) for name in ("src", "dst", "kind", "block"))
_KIND_INDEX: dict[str, int] = {kind: i for i, kind in enumerate(PAYLOAD_KINDS)}



_LEVELS: tuple[LinkLevel, ...] = ("intra_node", "inter_node", "inter_group")


def _level_codes(topology: Topology, src: IntArray, dst: IntArray) -> IntArray:
    """`Topology.level` of each (src, dst) as an index into `_LEVELS` (src != dst)."""
    node_src, node_dst = src // topology.ranks_per_node, dst // topology.ranks_per_node
    if topology.nodes_per_group is None:
        same_group = np.ones(src.shape, dtype=bool)
    else:
        same_group = node_src // topology.nodes_per_group == \
            node_dst // topology.nodes_per_group
    return np.where(node_src == node_dst, 0, np.where(same_group, 1, 2)).astype(np.int64)


def _exchange_time(plan: Plan, transfers: Sequence[Transfer], topology: Topology,
                   table: FloatArray) -> float:
    """One all_to_all: max over ranks of alpha + max(sent, received) / beta of each link
    class the rank's messages cross, the slowest class deciding (the per-rank arithmetic
    of `furnace.runtime.cost.direct_exchange_time`, over arrays)."""
    if not transfers:
        return 0.0
    n = len(transfers)
    src = np.fromiter(map(_SRC, transfers), dtype=np.int64, count=n)
    dst = np.fromiter(map(_DST, transfers), dtype=np.int64, count=n)
    kinds = np.fromiter(map(_KIND_INDEX.__getitem__, map(_KIND, transfers)),
                        dtype=np.int64, count=n)
    blocks = np.fromiter(map(_BLOCK, transfers), dtype=np.int64, count=n)
    nbytes = table[kinds, blocks]
    levels = _level_codes(topology, src, dst)
    worst = np.zeros(plan.num_ranks)
    for code in np.unique(levels).tolist():
        sel = levels == code
        sent = np.bincount(src[sel], weights=nbytes[sel], minlength=plan.num_ranks)
        received = np.bincount(dst[sel], weights=nbytes[sel], minlength=plan.num_ranks)
        busy = (sent > 0) | (received > 0)
        seconds = link_time_array(topology.link_for(_LEVELS[code]),
                                  np.maximum(sent, received))
        worst = np.maximum(worst, np.where(busy, seconds, 0.0))
    return float(worst.max())


def estimate_time(plan: Plan, topology: Topology | None = None, *,
                  backward: bool = True) -> float:
    """Closed-form seconds of ``plan`` with nothing overlapped: every all_to_all (stages and
    reductions, the backward's too unless ``backward=False``) as `_exchange_time`, plus the
    busiest rank's kernels at the device's peak (`furnace.runtime.cost.roofline_time`,
    FLOPs from `kernels.attention_flops`). Default topology:
    `furnace.runtime.presets.h100_ib`."""
    topo = topology or h100_ib()
    passes = [(plan.forward, plan.forward_reduce)]
    if backward:
        passes.append((plan.backward, plan.backward_reduce))
    lens = plan.grid.block_lens.astype(np.float64)
    table = np.array([[plan.shape.payload_bytes(kind, 1)] for kind in PAYLOAD_KINDS],
                     dtype=np.float64) * lens[None, :]
    comm = 0.0
    for stages, reduce in passes:
        for stage in stages:
            comm += _exchange_time(plan, stage.transfers, topo, table)
        comm += _exchange_time(plan, reduce, topo, table)
    elements = np.zeros(plan.num_ranks)
    for stage in plan.forward:
        for kernel in stage.kernels:
            elements[kernel.rank] += kernel.elements
    shape = plan.shape
    busiest = int(elements.max()) if elements.size else 0
    flops = attention_flops(busiest, shape.num_heads, shape.head_dim) * shape.batch
    if backward:
        flops += attention_flops(busiest, shape.num_heads, shape.head_dim,
                                 backward=True) * shape.batch
    return comm + roofline_time(topo.device, flops, dtype=shape.dtype)


# ---------------------------------------------------------------------- plan_attention


def _relaxations(config: TilingConfig) -> list[TilingConfig]:
    """The configs tried in turn until one is feasible: as given, without the diagonal pin,
    then tau doubled (from 0.05 when it is 0) ``relax_steps`` times, pinned then not."""
    out = [config]
    if config.pin_diagonal:
        out.append(dataclasses.replace(config, pin_diagonal=False))
    tol = config.balance_tolerance
    for _ in range(config.relax_steps):
        tol = min(1.0, 2 * tol if tol > 0 else 0.05)
        out.append(dataclasses.replace(config, balance_tolerance=tol))
        if config.pin_diagonal:
            out.append(dataclasses.replace(config, balance_tolerance=tol, pin_diagonal=False))
    return out


def _tile_layout(grid: BlockGrid, layout: Layout, shape: AttentionShape,
                 config: TilingConfig, ranks_per_node: int | None,
                 topology: Topology) -> tuple[str, TilingResult, int]:
    """(scheme, first feasible tiling of the relaxations, relaxations tried): hierarchical
    when ``ranks_per_node`` is given, flat otherwise. Before the last relaxation, an ILP
    whose greedy found nothing within the cap searches for a quarter of its time limit
    only, so that an infeasible cap costs little."""
    num_ranks = layout.num_ranks
    hierarchical = ranks_per_node is not None
    nonempty = int(np.count_nonzero(grid.kinds != EMPTY))
    use_ilp = nonempty * num_ranks <= config.max_ilp_size
    scheme = "tiled_hierarchical" if hierarchical else ("tiled_ilp" if use_ilp else
                                                        "tiled_greedy")
    attempts = _relaxations(config)
    result: TilingResult | None = None
    for tries, attempt in enumerate(attempts, start=1):
        if hierarchical:
            assert ranks_per_node is not None
            result = hierarchical_tiling(grid, layout, shape, ranks_per_node=ranks_per_node,
                                         config=attempt, topology=topology)
        else:
            problem = tiling_problem(grid, layout, shape, attempt)
            search = None if tries == len(attempts) else 0.25 * attempt.time_limit_s
            assign, status, bound, method, seconds = _solve(problem, attempt, use_ilp,
                                                            search_s=search)
            result = _result(problem, problem.rows, problem.cols, assign, status=status,
                             solve_s=seconds, bound=bound, method=method, config=attempt,
                             info={"layout": layout.kind})
        if result.feasible:
            return scheme, result, tries
    assert result is not None
    return scheme, result, len(attempts)


def _candidate_row(plan: Plan, estimate: float, tiling: TilingResult | None,
                   tries: int) -> dict[str, object]:
    stats = plan.stats()
    row: dict[str, object] = {
        "scheme": plan.scheme, "layout": plan.layout.kind, "estimate_s": estimate,
        "max_port": stats.max_port, "max_inbound": stats.max_inbound,
        "max_forward_inbound": stats.max_forward_inbound, "total_bytes": stats.total_bytes,
        "balance": stats.balance, "num_collectives": stats.num_collectives,
        "max_messages": stats.max_messages, "unused_bytes": sum(stats.unused_in),
        "staging": str(plan.info.get("staging", "distance"))}
    if tiling is not None:
        row.update({"status": tiling.status, "method": tiling.method,
                    "objective_units": tiling.objective, "bound_units": tiling.bound,
                    "solve_s": tiling.solve_s, "balance_tolerance": tiling.balance_tolerance,
                    "pin_diagonal": tiling.pin_diagonal, "relaxations": tries - 1})
    return row


def _where(plan: Plan) -> str:
    staging = plan.info.get("staging")
    return plan.layout.kind + (f", {staging} staging" if staging == "single" else "")


def plan_attention(grid: BlockGrid, num_ranks: int, shape: AttentionShape, *,
                   config: TilingConfig | None = None, layouts: Iterable[str] = LAYOUTS,
                   granularity: str = "block", ranks_per_node: int | None = None,
                   topology: Topology | None = None, baselines: bool = True) -> Plan:
    """The best plan for ``grid`` on ``num_ranks`` ranks: every baseline
    (`baselines.baseline_plans`) and the tiling under each of ``layouts`` that divides the
    grid (ILP when non-empty blocks x ranks <= ``config.max_ilp_size``, else greedy; also
    hierarchical when ``ranks_per_node`` < ``num_ranks``; when no tiling meets the work cap
    the cap is relaxed as `TilingConfig.relax_steps` says), each priced by `estimate_time`
    on ``topology`` (default `furnace.runtime.presets.h100_ib`); the cheapest wins, ties
    to fewer bottleneck-port bytes. ``plan.info["candidates"]`` has every candidate's
    figures and ``plan.info["reason"]`` why the winner won. ``baselines=False`` prices the
    tilings only (the best 2-D tiling, to measure against the baselines); it raises
    `PlanError` when no tiling meets the work cap."""
    config = config or TilingConfig()
    if granularity not in GRANULARITIES:
        raise PlanError("granularity", f"must be one of {', '.join(GRANULARITIES)}, got "
                                       f"{granularity!r}")
    layouts = tuple(layouts)
    bad = [k for k in layouts if k not in LAYOUTS]
    if bad or not layouts:
        raise PlanError("layouts", f"must be a non-empty selection of {', '.join(LAYOUTS)}, "
                                   f"got {layouts!r}")
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks < 1:
        raise PlanError("num_ranks", f"must be an integer >= 1, got {num_ranks!r}")
    if ranks_per_node is not None and (not isinstance(ranks_per_node, int)
                                       or isinstance(ranks_per_node, bool)
                                       or ranks_per_node < 1
                                       or (ranks_per_node < num_ranks
                                           and num_ranks % ranks_per_node)):
        raise PlanError("ranks_per_node", f"must be a positive divisor of num_ranks "
                                          f"({num_ranks}), got {ranks_per_node!r}")
    topo = topology or h100_ib()
    candidates: list[tuple[Plan, TilingResult | None, int]] = [
        (plan, None, 0) for plan in baseline_plans(grid, shape, num_ranks,
                                                   granularity=granularity).values()
        if baselines]
    skipped: dict[str, str] = {}
    for kind in layouts:
        try:
            layout = make_layout(kind, grid.num_blocks, num_ranks)
        except LayoutError as exc:
            skipped[kind] = exc.allowed
            continue
        # with nodes, the flat tiling competes too: direct transfers make a node's remote
        # rows cost once per device that needs them, which the node level cannot see
        levels: list[int | None] = [None]
        if ranks_per_node is not None and ranks_per_node < num_ranks:
            levels.append(ranks_per_node)
        for per_node in levels:
            scheme, tiling, tries = _tile_layout(grid, layout, shape, config, per_node, topo)
            if not tiling.feasible:
                skipped[f"{scheme}:{kind}"] = (f"no tiling meets the work cap after {tries} "
                                               f"tries")
                continue
            # one tiling, both stagings: pipelined per peer distance, or one exchange
            for staging in STAGINGS:
                plan = build_plan(scheme, grid, layout, shape, tiling.assignment,
                                  granularity=granularity, staging=staging,
                                  info={"assigner": scheme, "tiling_status": tiling.status,
                                        "tiling_method": tiling.method,
                                        "objective_units": tiling.objective,
                                        "solve_s": tiling.solve_s,
                                        "balance_tolerance": tiling.balance_tolerance,
                                        "pin_diagonal": tiling.pin_diagonal})
                candidates.append((plan, tiling, tries))
    if not candidates:
        raise PlanError("layouts", f"no 2-D tiling of {grid.num_blocks} blocks on {num_ranks} "
                                   f"ranks meets the work cap: {skipped}")
    rows = []
    keyed = []
    for index, (plan, found, tries) in enumerate(candidates):
        estimate = estimate_time(plan, topo, backward=config.backward)
        rows.append(_candidate_row(plan, estimate, found, tries))
        stats = plan.stats()
        port = stats.max_port if config.backward else stats.max_forward_port
        keyed.append(((estimate, port, index), plan))
    keyed.sort(key=lambda item: item[0])
    (best_estimate, best_port, _), winner = keyed[0]
    reason = (f"{winner.scheme} ({_where(winner)}) has the lowest estimate "
              f"({best_estimate:.4g} s on {topo.name}")
    if len(keyed) > 1:
        (second_estimate, _, _), second = keyed[1]
        reason += (f"; next {second.scheme} ({_where(second)}) at "
                   f"{second_estimate:.4g} s")
    reason += ")"
    info = dict(winner.info)
    info.update({"candidates": rows, "reason": reason, "estimate_s": best_estimate,
                 "topology": topo.name, "skipped_layouts": skipped})
    return dataclasses.replace(winner, info=info)


# ------------------------------------------------------------------ choosing the grid


def degree_of_imbalance(grid: BlockGrid, num_ranks: int) -> float:
    """DLI (§2.1): ceil(COMP / CP) / (COMP / CP) - 1, COMP the work in full-block units."""
    comp = grid.total_work / float(grid.block_size * grid.block_size)
    if comp <= 0:
        return 0.0
    share = comp / num_ranks
    return math.ceil(share - 1e-9) / share - 1.0


def _packed_balance(grid: BlockGrid, num_ranks: int) -> float:
    """max / mean work of a largest-first packing of the blocks onto ``num_ranks`` ranks
    (a feasible balance the tiling can match or beat)."""
    work = np.sort(grid.counts[grid.kinds != EMPTY].astype(np.int64))[::-1]
    if work.size == 0:
        return 1.0
    loads = np.zeros(num_ranks, dtype=np.int64)
    for w in work.tolist():
        loads[int(np.argmin(loads))] += w
    return float(loads.max() * num_ranks / loads.sum())


def choose_num_blocks(mask_mod: MaskMod, seq_len: int, num_ranks: int, *,
                      candidates: Sequence[int] | None = None, theta: float = 0.05,
                      max_balance: float = 1.1) -> int:
    """The smallest number of blocks P (by default a multiple of 2 * CP, so every layout
    applies, up to 32 * CP) cutting ``seq_len`` into blocks of ceil(S / P) tokens whose DLI
    is at most ``theta`` and whose blocks pack onto the ranks within ``max_balance``; the
    mask is evaluated exactly up to 2^24 (q, kv) pairs, sampled above."""
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks < 1:
        raise PlanError("num_ranks", f"must be an integer >= 1, got {num_ranks!r}")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise PlanError("seq_len", f"must be an integer >= 1, got {seq_len!r}")
    if not _is_real(theta) or theta < 0:
        raise PlanError("theta", f"must be a number >= 0, got {theta!r}")
    if candidates is None:
        candidates = [2 * num_ranks * m for m in range(1, 17)]
    chosen = sorted({int(p) for p in candidates if 1 <= int(p) <= seq_len})
    tried: list[str] = []
    for p in chosen:
        block_size = -(-seq_len // p)
        if -(-seq_len // block_size) != p or p < num_ranks:
            continue
        if seq_len * seq_len <= _EXACT_GRID_ELEMENTS:
            grid = build_block_grid(mask_mod, seq_len, block_size)
        else:
            grid = sampled_block_grid(mask_mod, seq_len, block_size)
        dli = degree_of_imbalance(grid, num_ranks)
        packed = _packed_balance(grid, num_ranks)
        if dli <= theta and packed <= max_balance:
            return p
        tried.append(f"P={p}: DLI {dli:.3f}, packed balance {packed:.3f}")
    raise PlanError("theta", f"no number of blocks reaches DLI <= {theta} with balance <= "
                             f"{max_balance} ({'; '.join(tried) or 'no candidate fits'}); "
                             f"allow a larger theta or more candidates")


def ilp_gap(grid: BlockGrid, layout: Layout, shape: AttentionShape,
            config: TilingConfig | None = None) -> dict[str, object]:
    """The greedy's objective against the ILP's on one instance (the report's heuristic-gap
    table): the ILP here runs alone, without the greedy's cutoff, for
    ``config.time_limit_s``; ``gap`` = greedy / ILP (the ILP's best when time-limited) and
    ``gap_to_bound`` = greedy / the ILP's lower bound."""
    config = config or TilingConfig()
    problem = tiling_problem(grid, layout, shape, config)
    start = time.perf_counter()
    greedy = greedy_assignment(problem, time_s=config.greedy_time_s, seed=config.seed,
                               mip_rel_gap=config.mip_rel_gap)
    greedy_s = time.perf_counter() - start
    start = time.perf_counter()
    exact, status, bound = ilp_assignment(problem, time_limit_s=config.time_limit_s,
                                          mip_rel_gap=config.mip_rel_gap)
    ilp_s = time.perf_counter() - start
    greedy_value = problem.objective(greedy) if problem.meets_cap(greedy) else math.inf
    ilp_value = problem.objective(exact) if exact is not None else math.inf
    return {"layout": layout.kind, "num_ranks": layout.num_ranks,
            "num_tiles": problem.num_tiles, "greedy": greedy_value, "greedy_s": greedy_s,
            "ilp": ilp_value, "ilp_status": status, "ilp_s": ilp_s, "bound": bound,
            "gap": greedy_value / ilp_value if ilp_value > 0 else 1.0,
            "gap_to_bound": greedy_value / bound if bound else None}
