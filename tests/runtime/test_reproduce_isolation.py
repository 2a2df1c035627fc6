"""`furnace reproduce` experiments give the same result whatever ran before them (issue 12).

An experiment may share expensive work with the experiments before it only through
`RunContext.shared`, whose builders are pure functions of their keys; so it must compute
the same result alone in a fresh run as after its predecessors. Two checks:

- static, every experiments module: no module-level container written at run time, no
  ``global``, no memoising decorator (a cache that outlives the run), the hidden state that
  made results depend on order before (deltaformer's ``_trained``, moe's cached ``_bench``);
- dynamic, the experiments that share artifacts or are cheap, shrunk to seconds: each run
  alone in a fresh context twice (the same global seed), and once in the registry's order
  with one artifacts dict and a different global seed. The parts equal in the two alone
  runs are its deterministic parts (wall-clock seconds are not); those must be equal after
  the predecessors too, and every analytic, simulated and virtual-clock table must be wholly
  deterministic.

Shrinking: deltaformer trains every run for 3 steps on small batches (real training, in
this process); moe's `run_bench` (spawned ranks, seconds each) is replaced by a stand-in that
is a pure function of its `BenchConfig`, as the real one is on the virtual clock, so the
experiments' keying, sharing and assembly run for real and the measurement does not. Not
run here, for time: experiments that only measure and share nothing (moe `real_gate` and
`projection`, deltaformer `kernels`, the runtime's emulator, emulation's timings) and the
eigen and normal_modes solver runs (minutes); the static check covers their modules.
"""

from __future__ import annotations

import ast
import math
import statistics
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

import furnace
from furnace.runtime.reproduce import Experiment, RunContext, discover
from furnace.runtime.testing import seed_all

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

SRC = Path(furnace.__file__).parent
EXPERIMENT_MODULES = sorted(SRC.rglob("*experiments*.py"))
DETERMINISTIC_KINDS = ("analytic", "simulated", "virtual-clock")

# --- static: no state kept between experiments ---------------------------------------------

_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque"}
_MUTATORS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear",
             "add", "discard", "remove", "sort", "reverse", "__setitem__"}
_MEMOISERS = {"cache", "lru_cache", "cached"}


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                          ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in _MUTABLE_CALLS
    return False


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def run_time_state(source: str) -> list[str]:
    """What a module keeps between calls of its functions: module-level containers that a
    function writes, ``global`` statements, and memoised module-level functions."""
    tree = ast.parse(source)
    mutable: set[str] = set()
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_mutable(node.value):
            mutable |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and _is_mutable(node.value):
            if isinstance(node.target, ast.Name):
                mutable.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [f"{node.name} (line {node.lineno}) is memoised by "
                      f"@{_decorator_name(d)}" for d in node.decorator_list
                      if _decorator_name(d) in _MEMOISERS]
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                found.append(f"global {', '.join(node.names)} (line {node.lineno})")
            elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))
                  and isinstance(node.value, ast.Name) and node.value.id in mutable):
                found.append(f"{node.value.id}[...] written (line {node.lineno})")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id in mutable
                  and node.func.attr in _MUTATORS):
                found.append(f"{node.func.value.id}.{node.func.attr}() (line {node.lineno})")
    return sorted(set(found))


def test_the_static_check_finds_hidden_state():
    planted = '''
import functools
_trained: dict = {}
LOG = []
STEPS = {"swap": 3}
COUNT = 0

@functools.cache
def bench(cfg):
    return cfg

def train(c):
    global COUNT
    _trained[c] = 1
    LOG.append(c)
    return STEPS["swap"]
'''
    found = run_time_state(planted)
    assert len(found) == 4 and any("_trained[...]" in f for f in found)
    assert any("LOG.append" in f for f in found) and any("global COUNT" in f for f in found)
    assert any("bench" in f and "@cache" in f for f in found)
    assert not any("STEPS" in f for f in found)  # read-only constants are fine


@pytest.mark.parametrize("path", EXPERIMENT_MODULES,
                         ids=[p.relative_to(SRC).as_posix() for p in EXPERIMENT_MODULES])
def test_experiments_modules_keep_no_state_between_experiments(path):
    assert run_time_state(path.read_text()) == [], (
        "share work between experiments through ctx.shared(key, build), not module state")


# --- dynamic: alone, twice, and after the experiments before it -----------------------------

def _flatten(value, path=()):
    """{path: leaf} of nested dicts, lists, tuples and arrays; each container's own path
    maps to its type's name, so that a changed structure shows."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {path: value}
    out = {path: _Container(type(value).__name__)}
    for key, item in items:
        out.update(_flatten(item, (*path, key)))
    return out


class _Container(str):
    """The marker `_flatten` stores at a container's own path."""


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _check_order_independent(tmp_path: Path, experiments: list[Experiment], quick: bool):
    def run(exp, artifacts, tag):
        ctx = RunContext(out_dir=tmp_path / tag / exp.name, quick=quick, artifacts=artifacts)
        return exp.fn(ctx)

    alone = []
    for attempt in ("a", "b"):
        results = {}
        for exp in experiments:
            seed_all(1)
            results[exp.name] = run(exp, {}, attempt)
        alone.append(results)
    seed_all(2)  # the predecessors also leave the global RNGs elsewhere
    shared: dict = {}
    in_order = {exp.name: run(exp, shared, "ordered") for exp in experiments}

    for exp in experiments:
        first, second, after = (_flatten(asdict(r[exp.name]))
                                for r in (*alone, in_order))
        assert first.keys() == second.keys() == after.keys(), \
            f"{exp.name}: the result's structure depends on what ran before it"
        fixed = [p for p in first if _same(first[p], second[p])]
        leaves = [p for p in first if not isinstance(first[p], _Container)]
        assert len(set(fixed) & set(leaves)) >= len(leaves) / 2, \
            f"{exp.name}: mostly not reproducible"
        for i, table in enumerate(alone[0][exp.name].tables):
            if table.kind in DETERMINISTIC_KINDS:
                cells = [p for p in first if p[:2] == ("tables", i)]
                assert set(cells) <= set(fixed), f"{exp.name}: {table.kind} table " \
                    f"{table.title!r} differs between two runs alone"
        changed = [(p, first[p], after[p]) for p in fixed if not _same(first[p], after[p])]
        assert changed == [], f"{exp.name} depends on what ran before it: {changed[:5]}"
    return shared


def _experiments(system: str, names: tuple[str, ...]) -> list[Experiment]:
    """``names`` of ``system``, in the registry's order (the order a run uses)."""
    found = [e for e in discover(system) if e.name in names]
    assert [e.name for e in found] == list(names), "not in registry order or missing"
    return found


def _fake_run_bench(cfg):
    """A `BenchResult` for ``cfg`` without ranks: a pure function of the config."""
    from furnace.moe.bench import BenchResult, PolicyResult
    from furnace.moe.simulate import synthetic_counts

    rng = np.random.default_rng(zlib.crc32(repr(cfg).encode()))
    W = cfg.world_size
    counts = synthetic_counts(W, cfg.experts_per_rank, cfg.tokens_per_rank,
                              cfg.probabilities(), cfg.top_k).astype(int).tolist()
    emulated = cfg.mode == "emulated"
    result = BenchResult(cfg, "emulated" if emulated else "virtual-clock", "stand-in",
                         flops_per_s=2e10, bandwidth_Bps=1e8, latency_s=1e-5,
                         step_overhead_s=2e-5, flops_single_thread=1e10,
                         round_flops_single_thread=(1e10 * (1 + 0.1 * rng.random(cfg.steps)))
                         .tolist() if emulated else [])
    for i, policy in enumerate(cfg.policies):
        times = (1e-2 * (1 + 0.2 * rng.random(cfg.steps)) / (1 + 0.3 * i)).tolist()
        result.results[policy] = PolicyResult(
            policy=policy, step_s=statistics.median(times), step_times=times, cpu_s=1e-3,
            bytes_sent=[2**20] * W, bytes_received=[2**20] * W, messages=[W] * W,
            tokens_computed=[cfg.tokens_per_rank] * W, load_max_over_mean=1.5,
            shadowed=[0] if policy in ("shadow", "both") and cfg.routing == "hot" else [],
            group_size=cfg.group_size or (2 if policy in ("smart", "both") else W),
            counts_WN=counts)
    return result


@pytest.mark.timeout(180)
def test_moe_experiments_do_not_depend_on_order(tmp_path, monkeypatch):
    from furnace.moe import experiments as ex

    built = []

    def counting(cfg):
        built.append(cfg)
        return _fake_run_bench(cfg)

    monkeypatch.setattr(ex, "run_bench", counting)
    experiments = _experiments("moe", ("bench", "validation", "skew", "group_size",
                                       "roofline"))
    shared = _check_order_independent(tmp_path, experiments, quick=True)
    # bench and validation share the 4-rank emulated runs within a run, never across runs
    alone_runs = len(built) - len(shared)
    assert alone_runs == 2 * (4 + 4) and len(shared) == 4 + 4 - 2


@pytest.fixture
def tiny_deltaformer(monkeypatch):
    """Every run 3 steps on small batches and evaluations, trained in this process."""
    from furnace.deltaformer import experiments as ex
    from furnace.deltaformer.train import TrainConfig, train_many

    def tiny(**kw):
        kw = {"batch_size": 8, "eval_sequences": 64, **kw, "steps": 3}
        return TrainConfig(**kw)

    monkeypatch.setattr(ex, "TrainConfig", tiny)
    monkeypatch.setattr(ex, "LM_RECIPE", dict(task="lm", length=16, d_model=16, num_layers=1,
                                              num_heads=4, batch_size=4, eval_sequences=8,
                                              corpus_bytes=200_000))
    trained = []

    def in_process(configs, workers=None, on_done=None):
        trained.extend(configs)
        return train_many(configs, workers=1, on_done=on_done)

    monkeypatch.setattr(ex, "train_many", in_process)
    return trained


@pytest.mark.timeout(300)
def test_deltaformer_experiments_do_not_depend_on_order(tmp_path, tiny_deltaformer):
    # the full set: kappa1 reuses the runs of swap, parity_modarith and lm
    experiments = _experiments("deltaformer", ("swap", "parity_modarith", "lm", "kappa1"))
    shared = _check_order_independent(tmp_path, experiments, quick=False)
    unique = len(shared)
    # alone, every experiment trains all its runs; in order, each run once
    assert len(tiny_deltaformer) > 3 * unique
    assert all(key[0] == "deltaformer.train" for key in shared)


@pytest.mark.timeout(120)
def test_emulation_experiments_do_not_depend_on_order(tmp_path):
    experiments = _experiments("emulation", ("ladder", "ozaki1_slices", "speedup"))
    _check_order_independent(tmp_path, experiments, quick=True)
