"""Load balance at scale: BaGuaLu's SWIPE gate against GShard and Switch with capacity drops
(BaGuaLu, Ma et al. PPoPP '22, its SWIPE gate as FastMoE's `SwipeGate`; issue 13, item 4;
design note moe_bagualu.md, B.3, recalled from secondary sources, not checked against the
paper).

Two parts:

1. `routing_balance`: route one seeded, skewed batch of gate logits as if it came from
   ``ranks`` expert-parallel ranks, through each gate's real ``route`` (`furnace.moe`'s
   ``gshard``, ``switch`` and ``swipe`` gates), and count from the returned
   ``expert_ids_TK`` the per-expert loads, the drops (-1 entries) and the redirections
   (kept assignments on an expert outside the token's own top-k). Every count comes from
   the gates' outputs; only the capacities are the gates' own rules.
2. `balance_loss_curves`: train the same tiny `furnace.moe.MoETransformerLM` (same seed,
   same batches of the stdlib byte corpus, `furnace.runtime.corpus`) with each gate for
   the same steps on `furnace.runtime.training.train_loop`, in one process, and return the
   cross-entropy of every step. Expert parallelism is not needed for the loss effect: a
   gate's decisions do not depend on where the experts live, and the multi-rank SWIPE
   gate computes exactly what one process computes on the gathered batch (the all-gather
   of its logits, checked on gloo ranks in tests/hybrid/test_balance.py).

How the ranks are emulated, gate by gate (each gate's own multi-rank capacity rule, which
is where they differ):

- GShard and Switch: capacity is *per rank* (``C_r = ceil(capacity_factor * T_r * K / N)``
  from ``gate.capacity(T_r)``, T_r = this rank's tokens), so each rank limits what it sends
  to each expert with no collective; an expert then receives at most ``ranks * C_r``.
  Each rank's slice of the batch is routed on its own (what `EmulatedRanksGate` does:
  consecutive equal slices, one ``route`` each) and the group capacity of an expert is
  reported as ``ranks * C_r``. `EmulatedRanksGate` itself is not used because it feeds
  inputs through the gate's scorer, while this study routes given logits, and because of
  the next point.
- SWIPE: capacity is *per group* (``C = ceil(G * K / N)``, G = the group's tokens): every
  rank all-gathers the logits and runs the same deterministic assignment over the whole
  group (`furnace.moe` gate ``swipe``). The faithful emulation is therefore one ``route``
  over the concatenated batch in rank order. Wrapping the gate in `EmulatedRanksGate`
  would bind contexts without a communicator, so each slice would balance alone with a
  per-slice capacity: a different (and weaker) gate.

Skew: token t's logit for expert e is ``-skew * log(e + 1) + g_te`` with g i.i.d. standard
Gumbel noise, so its top-1 expert is a draw from the Zipf law ``p_e ~ (e + 1)^-skew``
(the Gumbel-max trick) and its top-k a draw without replacement; skew 0 is uniform, a
large skew sends almost every token to expert 0. This synthetic skew is our
reconstruction, not the paper's workload.

What follows the paper (as the design note recalls it): SWIPE keeps every token and
bounds every expert's load by the balanced share; GShard and Switch drop what exceeds
their capacity. What is ours: the
gates' details (documented in their modules, e.g. SWIPE's swap rule for a cornered token),
the skew model, the sizes, and the GShard setting below. GShard's random routing (dropping
weak second choices at random in training) is switched off in `routing_balance`, so every
-1 there is a capacity drop and the counts are deterministic; the training part keeps the
gates as the library builds them, except that GShard and Switch get ``capacity_factor``.

Shape suffixes: G = tokens of the group (all emulated ranks), N = experts, K = top_k,
B = batch, T = sequence length, V = vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from furnace.moe import BaseGate, MoELMConfig, MoETransformerLM, make_gate
from furnace.runtime.corpus import CorpusConfig, batches, load_corpus
from furnace.runtime.training import TrainLoopConfig, TrainResult, train_loop

__all__ = [
    "BALANCE_COLUMNS",
    "BALANCE_GATES",
    "BalanceConfig",
    "BalanceRow",
    "BalanceStudy",
    "balance_loss_curves",
    "balance_study",
    "gate_top_k",
    "route_group",
    "routing_balance",
    "skewed_logits",
]

# the gates compared; GShard is top-2 and Switch top-1 by their papers, SWIPE takes any k
BALANCE_GATES = ("gshard", "switch", "swipe")
FIXED_TOP_K = {"gshard": 2, "switch": 1}
# gradient-norm clip of the training part, as furnace.moe's LM trainer uses
GRADIENT_CLIP = 1.0


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class BalanceConfig:
    """One balance study: the emulated routing batch and the tiny training runs.

    Attributes:
        num_experts: N, global experts of the routing part (a multiple of ``ranks``: each
            expert-parallel rank holds ``num_experts // ranks``).
        top_k: SWIPE's experts per token (GShard is always top-2, Switch top-1).
        tokens_per_rank: tokens each emulated rank routes.
        ranks: emulated expert-parallel ranks.
        capacity_factor: GShard's and Switch's capacity factor (SWIPE has none: its
            capacity is the balanced share).
        skew: Zipf exponent of the experts' popularity (0: uniform; see the module doc).
        seed: the logits' noise, and the model, dropout and batches of the training part.
        gates: the gates to compare, names from `BALANCE_GATES`.
        steps: optimizer steps of each training run.
        lm_d_model, lm_num_layers, lm_num_heads, lm_seq_len, lm_num_experts, lm_d_hidden:
            the tiny `furnace.moe.MoELMConfig` (vocabulary 256, the byte corpus).
        lm_batch_size: sequences per training step.
        lr: AdamW learning rate (constant).
        balance_loss_weight: weight of the gates' auxiliary losses in the training loss
            (SWIPE has none); the returned curves are the cross-entropy alone.
        corpus_bytes: bytes of the stdlib corpus to load.
    """

    num_experts: int = 128
    top_k: int = 2
    tokens_per_rank: int = 128
    ranks: int = 128
    capacity_factor: float = 1.2
    skew: float = 1.0
    seed: int = 0
    gates: tuple[str, ...] = BALANCE_GATES
    steps: int = 40
    lm_d_model: int = 16
    lm_num_layers: int = 2
    lm_num_heads: int = 2
    lm_seq_len: int = 32
    lm_num_experts: int = 8
    lm_d_hidden: int = 32
    lm_batch_size: int = 8
    lr: float = 3e-3
    balance_loss_weight: float = 0.01
    corpus_bytes: int = 200_000

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "tokens_per_rank", "ranks", "steps",
                     "lm_d_model", "lm_num_layers", "lm_num_heads", "lm_seq_len",
                     "lm_num_experts", "lm_d_hidden", "lm_batch_size", "corpus_bytes"):
            _positive_int(name, getattr(self, name))
        if self.num_experts % self.ranks:
            raise ValueError(f"num_experts={self.num_experts} must be a multiple of "
                             f"ranks={self.ranks} (each rank holds the same experts)")
        _positive_float("capacity_factor", self.capacity_factor)
        _positive_float("lr", self.lr)
        for name in ("skew", "balance_loss_weight"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not isinstance(self.gates, tuple) or not self.gates:
            raise ValueError(f"gates must be a non-empty tuple of names, got {self.gates!r}")
        unknown = [g for g in self.gates if g not in BALANCE_GATES]
        if unknown:
            raise ValueError(f"gates: unknown {unknown}; known: {list(BALANCE_GATES)}")
        if len(set(self.gates)) != len(self.gates):
            raise ValueError(f"gates must not repeat a name, got {self.gates!r}")
        if self.lm_d_model % self.lm_num_heads:
            raise ValueError(f"lm_num_heads={self.lm_num_heads} must divide "
                             f"lm_d_model={self.lm_d_model}")
        for experts_name in ("num_experts", "lm_num_experts"):
            experts = getattr(self, experts_name)
            for gate in self.gates:
                k = gate_top_k(gate, self.top_k)
                if k > experts:
                    raise ValueError(f"{experts_name}={experts} is fewer than gate {gate!r}'s "
                                     f"top_k={k}")

    def lm_config(self, gate: str) -> MoELMConfig:
        """The tiny LM of the training part, routed by ``gate``."""
        return MoELMConfig(vocab_size=256, d_model=self.lm_d_model,
                           num_layers=self.lm_num_layers, num_heads=self.lm_num_heads,
                           seq_len=self.lm_seq_len, num_experts=self.lm_num_experts,
                           top_k=gate_top_k(gate, self.top_k), d_hidden=self.lm_d_hidden,
                           gate=gate, balance_loss_weight=self.balance_loss_weight)


def gate_top_k(gate: str, top_k: int) -> int:
    """The k a gate routes with: GShard 2, Switch 1, SWIPE the configured ``top_k``."""
    return FIXED_TOP_K.get(gate, top_k)


def _build_gate(name: str, d_model: int, num_experts: int, top_k: int,
                capacity_factor: float, *, random_routing: bool) -> BaseGate:
    kwargs: dict[str, Any] = {}
    if name in FIXED_TOP_K:
        kwargs["capacity_factor"] = capacity_factor
    if name == "gshard":
        kwargs["random_routing"] = random_routing
    return make_gate(name, d_model, num_experts, gate_top_k(name, top_k), **kwargs)


def _rank_capacity(gate: BaseGate, tokens: int) -> int:
    """``gate.capacity(tokens)``: what one rank sends at most to one expert."""
    capacity = getattr(gate, "capacity", None)
    if not callable(capacity):
        raise TypeError(f"gate {type(gate).__name__} has no per-rank capacity")
    return int(capacity(tokens))


def skewed_logits(config: BalanceConfig) -> torch.Tensor:
    """[G, N] float64 logits of the whole group, rank 0's tokens first (see the module doc)."""
    generator = torch.Generator().manual_seed(config.seed)
    G, N = config.ranks * config.tokens_per_rank, config.num_experts
    uniform_GN = torch.rand((G, N), generator=generator, dtype=torch.float64)
    # Gumbel(0, 1) = -log(-log U); the clamp keeps U = 0 from giving an infinite logit
    gumbel_GN = -torch.log(-torch.log(uniform_GN.clamp_min(1e-300)))
    popularity_N = -config.skew * torch.log(torch.arange(1, N + 1, dtype=torch.float64))
    return popularity_N + gumbel_GN


def route_group(name: str, logits_GN: torch.Tensor, *, ranks: int, top_k: int,
                capacity_factor: float) -> tuple[torch.Tensor, int, int | None]:
    """Route a group's logits through gate ``name`` as ``ranks`` expert-parallel ranks.

    Args:
        logits_GN: the group's logits, rank order (``G`` a multiple of ``ranks``).
        top_k: SWIPE's k (GShard and Switch use their own).

    Returns:
        expert_ids_GK: the gate's decisions, -1 where dropped.
        capacity: the most one expert may receive from the whole group under the gate's
            rule (GShard/Switch: ``ranks * C_r``; SWIPE: ``ceil(G * K / N)``).
        capacity_per_rank: GShard/Switch's ``C_r``; None for SWIPE (its capacity is
            group-wide).
    """
    G, N = logits_GN.shape
    if ranks < 1 or G % ranks:
        raise ValueError(f"{G} tokens do not split into {ranks} equal ranks")
    # the scorer is never used: route() takes the logits
    gate = _build_gate(name, 1, N, top_k, capacity_factor, random_routing=False)
    gate.eval()
    k = gate_top_k(name, top_k)
    with torch.no_grad():
        if name == "swipe":
            # what every rank computes after all-gathering the group's logits
            ids_GK = gate.route(logits_GN).expert_ids_TK
            return ids_GK, -(-G * k // N), None
        T = G // ranks
        parts = [gate.route(logits_GN[r * T:(r + 1) * T]).expert_ids_TK for r in range(ranks)]
    return torch.cat(parts), ranks * _rank_capacity(gate, T), _rank_capacity(gate, T)


@dataclass(frozen=True)
class BalanceRow:
    """One gate's routing of the study's batch; counts from its ``expert_ids_TK``.

    Attributes:
        gate, top_k: the gate and the k it routed with.
        tokens, assignments: G and G * K.
        capacity: the most one expert may receive from the group (see `route_group`).
        capacity_per_rank: the per-rank capacity C_r (None: SWIPE's is group-wide).
        max_load, mean_load: kept assignments of the busiest expert and per expert.
        max_over_mean: ``max_load / mean_load`` (1 is perfectly balanced).
        demand_max_over_mean: the same for the token's own top-k preferences, before any
            capacity: how skewed the batch is.
        max_load_over_capacity: ``max_load / capacity`` (<= 1 for every gate).
        dropped, dropped_fraction: assignments with id -1, and their share of assignments.
        redirected, redirected_fraction: kept assignments to an expert outside the token's
            own top-k logits (SWIPE's moves), and their share of assignments.
    """

    gate: str
    top_k: int
    tokens: int
    assignments: int
    capacity: int
    capacity_per_rank: int | None
    max_load: int
    mean_load: float
    max_over_mean: float
    demand_max_over_mean: float
    max_load_over_capacity: float
    dropped: int
    dropped_fraction: float
    redirected: int
    redirected_fraction: float


def _count(name: str, logits_GN: torch.Tensor, expert_ids_GK: torch.Tensor, capacity: int,
           capacity_per_rank: int | None) -> BalanceRow:
    G, N = logits_GN.shape
    K = expert_ids_GK.shape[1]
    # a stable descending sort ranks equal logits by expert id, as the gates break ties
    preferred_GK = torch.sort(logits_GN, dim=-1, descending=True, stable=True).indices[:, :K]
    kept_GK = expert_ids_GK >= 0
    load_N = torch.bincount(expert_ids_GK[kept_GK], minlength=N)
    demand_N = torch.bincount(preferred_GK.reshape(-1), minlength=N)
    on_preferred_GK = (expert_ids_GK[:, :, None] == preferred_GK[:, None, :]).any(-1)
    redirected = int((kept_GK & ~on_preferred_GK).sum())
    dropped = int((~kept_GK).sum())
    assignments = G * K
    max_load = int(load_N.max())
    mean_load = float(load_N.sum()) / N
    demand_mean = float(demand_N.sum()) / N
    return BalanceRow(
        gate=name, top_k=K, tokens=G, assignments=assignments, capacity=capacity,
        capacity_per_rank=capacity_per_rank, max_load=max_load, mean_load=mean_load,
        max_over_mean=max_load / mean_load if mean_load > 0 else math.nan,
        demand_max_over_mean=float(demand_N.max()) / demand_mean,
        max_load_over_capacity=max_load / capacity, dropped=dropped,
        dropped_fraction=dropped / assignments, redirected=redirected,
        redirected_fraction=redirected / assignments)


def routing_balance(config: BalanceConfig) -> list[BalanceRow]:
    """Each of ``config.gates`` routing the same skewed batch of ``config.ranks`` ranks."""
    logits_GN = skewed_logits(config)
    rows = []
    for name in config.gates:
        ids_GK, capacity, per_rank = route_group(name, logits_GN, ranks=config.ranks,
                                                 top_k=config.top_k,
                                                 capacity_factor=config.capacity_factor)
        rows.append(_count(name, logits_GN, ids_GK, capacity, per_rank))
    return rows


def balance_loss_curves(config: BalanceConfig) -> dict[str, list[float]]:
    """Per gate, the training cross-entropy of every step of the same tiny MoE LM.

    Every run starts from the same weights (same seed, and the gates share one scorer
    shape, so the initialisation draws the same numbers) and sees the same batches (the
    loop's generator, seeded alike). GShard and Switch get ``config.capacity_factor``;
    their gates are otherwise the library's (GShard's random routing and Switch's input
    jitter on, in training). The loss optimised is the cross-entropy plus
    ``balance_loss_weight`` times the gates' auxiliary losses; the curve is the
    cross-entropy, so gates with and without an auxiliary loss compare on the same
    quantity. A run whose loss stops being finite stops there (its curve ends with it).
    """
    corpus = load_corpus(CorpusConfig(num_bytes=config.corpus_bytes))
    loop = TrainLoopConfig(steps=config.steps, lr=config.lr, weight_decay=0.01,
                           clip=GRADIENT_CLIP, schedule="constant", seed=config.seed)
    return {name: _train_curve(name, config, corpus.train, loop) for name in config.gates}


def _train_curve(name: str, config: BalanceConfig, data: torch.Tensor,
                 loop: TrainLoopConfig) -> list[float]:
    """One training run of the tiny LM routed by gate ``name``: its cross-entropy per step."""
    lm = config.lm_config(name)
    cross_entropy: list[float] = []

    def build_model() -> MoETransformerLM:
        model = MoETransformerLM(lm)
        for layer in model.moe_layers():
            built = layer.gate
            assert isinstance(built, BaseGate)
            # the configured capacity factor; the scorer keeps the model's initial weights
            gate = _build_gate(name, lm.d_model, lm.num_experts, config.top_k,
                               config.capacity_factor, random_routing=True)
            gate.scorer.load_state_dict(built.scorer.state_dict())
            layer.gate = gate
        return model

    def loss(model: MoETransformerLM, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x_BT, y_BT = batch
        logits_BTV, _ = model(x_BT)
        ce = F.cross_entropy(logits_BTV.reshape(-1, logits_BTV.shape[-1]), y_BT.reshape(-1))
        cross_entropy.append(float(ce.detach()))
        balance = sum((layer.balance_loss for layer in model.moe_layers()), ce.new_zeros(()))
        return ce + config.balance_loss_weight * balance

    def train_batches(generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return batches(data, batch_size=config.lm_batch_size, seq_len=lm.seq_len,
                       generator=generator)

    train_loop(loop, build_model=build_model, batches=train_batches, loss=loss,
               result=TrainResult())
    return cross_entropy


BALANCE_COLUMNS = ("gate", "top-k", "capacity / expert", "capacity / rank", "max/mean load",
                   "demand max/mean", "max load / capacity", "dropped", "dropped %",
                   "redirected", "redirected %", "final loss")


@dataclass(frozen=True)
class BalanceStudy:
    """`routing_balance` and `balance_loss_curves` of one config.

    The routing numbers are emulated ranks in one process (counts, machine-independent);
    the losses are measured training runs (they depend on the thread count and the Python
    version's stdlib bytes).
    """

    config: BalanceConfig
    rows: list[BalanceRow]
    curves: dict[str, list[float]] = field(default_factory=dict)

    def final_loss(self, gate: str) -> float:
        """The last training cross-entropy of ``gate`` (NaN without a curve)."""
        curve = self.curves.get(gate, [])
        return curve[-1] if curve else math.nan

    def table(self) -> list[list[Any]]:
        """Rows for a `furnace.runtime.reproduce.Table` with columns `BALANCE_COLUMNS`."""
        return [[row.gate, row.top_k, row.capacity,
                 "group" if row.capacity_per_rank is None else row.capacity_per_rank,
                 row.max_over_mean, row.demand_max_over_mean, row.max_load_over_capacity,
                 row.dropped, 100 * row.dropped_fraction, row.redirected,
                 100 * row.redirected_fraction, self.final_loss(row.gate)]
                for row in self.rows]


def balance_study(config: BalanceConfig, *, train: bool = True) -> BalanceStudy:
    """The routing table and (unless ``train`` is False) the loss curves of ``config``."""
    curves = balance_loss_curves(config) if train else {}
    return BalanceStudy(config=config, rows=routing_balance(config), curves=curves)
