"""Mixed precision as BaGuaLu trains with it (Ma et al., PPoPP'22; issue 13, item 2),
applied from outside to an unchanged `furnace.moe` model on a CPU.

What follows the paper (design note B.3, recalled from secondary sources, not verified
against the PDF): the matrix work (GEMMs) runs in half precision (bf16 or fp16, which run
at 4x the FP64 rate on the SW26010-Pro), the master weights and the optimizer state stay in
fp32, the numerically sensitive operators (softmax, normalisation, the MoE gate) run in
fp32, fp16 runs need loss scaling, and the model states cost 16 bytes per parameter with
Adam (2 half-precision weights + 2 half-precision gradients + 4 fp32 master + 8 Adam
m and v; the 16 B/param that makes 174T parameters need about 2.8 PB).

What is our reconstruction: the mechanism. `MixedPrecision.apply` wraps the model's forward
in ``torch.autocast("cpu", dtype)`` and forces every sensitive module (norms, softmax
modules, and each `furnace.moe.MoELayer`'s gate) back to fp32 by running its forward with
autocast disabled and its floating inputs cast to fp32. Autocast, not explicit bf16 weight
copies, because then the model's parameters *are* the fp32 master weights: the training
loop's own AdamW (`furnace.runtime.training.train_loop`), its checkpoints and exact resume,
the MoDa gradient all-reduce and DCP resharding all see ordinary fp32 parameters and need
no copy-back step. The price is the split of the 16 bytes: autocast keeps fp32 gradients
(4 B, not 2) and no persistent bf16 weights; its bf16 copies of the matrix weights
(2 B per matrix-weight element) live only from a forward to its backward. `account_memory`
gives both splits and `measure_memory` counts the storage of the real tensors.

Attention's softmax runs inside ``scaled_dot_product_attention``, which autocast runs in
bf16; torch's CPU flash-attention kernel accumulates the softmax in its ``opmath_type``,
fp32 for bf16 inputs (recalled from the torch source, not checked by a test here), so it is
left there rather than forcing the attention GEMMs to fp32. The training loss
(``cross_entropy``) is on autocast's CPU fp32 list.

`DynamicLossScaler` is the fp16 recipe (Micikevicius et al., "Mixed Precision Training",
ICLR 2018; the rule of ``torch.amp.GradScaler``): gradients of ``scale * loss``, unscaled
before clipping, a step with an inf or NaN gradient is skipped and the scale backed off,
and after ``growth_interval`` clean steps in a row it grows. The loss value the loop records
stays unscaled: the scale enters the backward pass only (`DynamicLossScaler.scale_loss`).

Shape suffixes: B = batch, T = sequence length.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch
from torch import nn

from furnace.moe import MLPExperts, MoELayer, MoELMConfig, MoETransformerLM
from furnace.runtime.timing import (
    Timing,
    median_paired_ratio,
    round_robin,
    stopwatch,
    torch_threads,
)
from furnace.runtime.training import TrainHooks

__all__ = [
    "BAGUALU_BYTES_PER_PARAM",
    "DEFAULT_FP32_TYPES",
    "DynamicLossScaler",
    "LossScaleConfig",
    "MemoryAccount",
    "MemoryMeasurement",
    "MixedPrecision",
    "MixedPrecisionConfig",
    "PrecisionSpeed",
    "PrecisionSpeedConfig",
    "account_memory",
    "cpu_half_precision_features",
    "measure_memory",
    "measure_precision_speed",
]

M = TypeVar("M", bound=nn.Module)
Batch = TypeVar("Batch")

DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}

# modules whose forward runs in fp32 under the policy (the MoE gate is added per MoELayer)
DEFAULT_FP32_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._BatchNorm,
    nn.Softmax, nn.LogSoftmax, nn.Softmin,
)

# the paper's model-state split with Adam (design note B.3, ZeRO's K = 12 + 4)
BAGUALU_BYTES_PER_PARAM: dict[str, int] = {
    "half_weights": 2, "half_grads": 2, "fp32_master": 4, "adam_m": 4, "adam_v": 4,
}


@dataclass(kw_only=True)
class LossScaleConfig:
    """Dynamic loss scaling (the defaults are ``torch.amp.GradScaler``'s).

    Attributes:
        init_scale: the first scale.
        growth_factor: the scale is multiplied by it after ``growth_interval`` clean steps.
        backoff_factor: the scale is multiplied by it at every overflowing step.
        growth_interval: clean steps in a row before the scale grows.
    """

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            raise ValueError(f"init_scale must be positive and finite, got {self.init_scale}")
        if not self.growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {self.growth_factor}")
        if not 0 < self.backoff_factor < 1:
            raise ValueError(f"backoff_factor must be in (0, 1), got {self.backoff_factor}")
        if isinstance(self.growth_interval, bool) or self.growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {self.growth_interval}")


@dataclass(kw_only=True)
class MixedPrecisionConfig:
    """The precision policy.

    Attributes:
        dtype: the matrix-work dtype, "bfloat16" or "float16".
        loss_scale: dynamic loss scaling; None means none. fp16 needs it (its exponent
            range underflows small gradients), so None with fp16 takes the defaults; bf16
            has fp32's exponent range and needs none.
        fp32_types: module types forced to fp32 (every MoE layer's gate is forced too).
    """

    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    loss_scale: LossScaleConfig | None = None
    fp32_types: tuple[type[nn.Module], ...] = DEFAULT_FP32_TYPES

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.dtype == "float16" and self.loss_scale is None:
            self.loss_scale = LossScaleConfig()

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


class _ScaleGradient(torch.autograd.Function):
    """Identity in the forward pass, gradient times ``scale`` in the backward pass."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class DynamicLossScaler:
    """Loss scaling that skips overflowing steps and counts them.

    One step: `scale_loss` before backward; `unscale_` after the gradients are complete
    (reduced, in a parallel trainer) and before clipping; `update` after clipping, which
    returns True when the step must be skipped (an inf or NaN gradient) and moves the scale.

    Args:
        config: the scale's rule.
        sync_found_inf: makes the overflow flag (a float tensor, 1.0 for overflow) agree
            across ranks in place, e.g. an all-reduce with MAX, so every rank skips the
            same steps; None in one process.

    Attributes:
        scale: the current scale.
        growth_tracker: clean steps since the scale last changed or overflowed.
        steps: updates made.
        skipped_steps: updates that skipped the optimizer step.
        skipped: the 1-based update indices that were skipped.
    """

    def __init__(self, config: LossScaleConfig | None = None, *,
                 sync_found_inf: Callable[[torch.Tensor], None] | None = None) -> None:
        self.config = config or LossScaleConfig()
        self.sync_found_inf = sync_found_inf
        self.scale = float(self.config.init_scale)
        self.growth_tracker = 0
        self.steps = 0
        self.skipped_steps = 0
        self.skipped: list[int] = []
        self._found_inf: bool | None = None
        self._unscaled_with: float | None = None

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` with the same value whose gradients are ``scale`` times larger."""
        result: torch.Tensor = _ScaleGradient.apply(loss, self.scale)  # type: ignore[no-untyped-call]
        return result

    def unscale_(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide the gradients by the scale in place; return whether any is inf or NaN."""
        grads = [p.grad for p in params if p.grad is not None]
        found = torch.zeros((), dtype=torch.float32)
        inv_scale = 1.0 / self.scale
        with torch.no_grad():
            for g in grads:
                g.mul_(inv_scale)
                if not bool(torch.isfinite(g).all()):
                    found.fill_(1.0)
        if self.sync_found_inf is not None:
            self.sync_found_inf(found)
        self._found_inf = bool(found.item() > 0)
        self._unscaled_with = self.scale
        return self._found_inf

    def update(self) -> bool:
        """End the step: return True when it must be skipped; back off or grow the scale."""
        if self._found_inf is None:
            raise RuntimeError("update() needs unscale_() first in the same step")
        overflow = self._found_inf
        self._found_inf = None
        self.steps += 1
        if overflow:
            self.scale *= self.config.backoff_factor
            self.growth_tracker = 0
            self.skipped_steps += 1
            self.skipped.append(self.steps)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.config.growth_interval:
                self.scale *= self.config.growth_factor
                self.growth_tracker = 0
        return overflow

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "steps": self.steps, "skipped_steps": self.skipped_steps,
                "skipped": list(self.skipped)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.steps = int(state["steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.skipped = [int(s) for s in state["skipped"]]


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() \
            and value.dtype in (torch.bfloat16, torch.float16):
        return value.float()
    if isinstance(value, tuple):
        return tuple(_to_fp32(v) for v in value)
    if isinstance(value, list):
        return [_to_fp32(v) for v in value]
    return value


class _PrecisionForward:
    """A module's forward run in a precision region (set as the instance's ``forward``).

    It calls the class's forward, so deep-copying the module copies a working wrapper.
    """

    def __init__(self, module: nn.Module, *, fp32: bool, dtype: torch.dtype) -> None:
        self.module = module
        self.fp32 = fp32
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = type(self.module).forward
        if self.fp32:
            with torch.autocast("cpu", enabled=False):
                return forward(self.module, *_to_fp32(args),
                               **{k: _to_fp32(v) for k, v in kwargs.items()})
        with torch.autocast("cpu", dtype=self.dtype):
            return forward(self.module, *args, **kwargs)


class MixedPrecision:
    """BaGuaLu's precision policy for a model that knows nothing of it.

    ``policy.apply(model)`` makes the model's forward run under autocast in the policy's
    dtype, with the sensitive modules in fp32; the parameters stay fp32 (they are the master
    weights), so the optimizer's state is fp32 too. In `furnace.runtime.training.train_loop`
    pass ``hooks=policy.hooks(...)`` and ``loss=policy.wrap_loss(loss)``.
    """

    def __init__(self, config: MixedPrecisionConfig | None = None, *,
                 sync_found_inf: Callable[[torch.Tensor], None] | None = None) -> None:
        self.config = config or MixedPrecisionConfig()
        self.scaler = (None if self.config.loss_scale is None
                       else DynamicLossScaler(self.config.loss_scale,
                                              sync_found_inf=sync_found_inf))

    @property
    def dtype(self) -> torch.dtype:
        return self.config.torch_dtype

    def fp32_modules(self, model: nn.Module) -> list[nn.Module]:
        """The modules forced to fp32: norms, softmax modules and every MoE layer's gate."""
        found: dict[int, nn.Module] = {}
        for module in model.modules():
            if isinstance(module, self.config.fp32_types):
                found[id(module)] = module
            if isinstance(module, MoELayer):
                found[id(module.gate)] = module.gate
        # a module inside an fp32 module is already in the fp32 region
        inner = {id(sub) for m in found.values() for sub in m.modules() if sub is not m}
        return [m for key, m in found.items() if key not in inner]

    def apply(self, model: M) -> M:
        """Patch ``model`` in place (its class and state dict are untouched); return it."""
        if isinstance(model.__dict__.get("forward"), _PrecisionForward):
            raise ValueError("this model already has a precision policy applied")
        fp32 = self.fp32_modules(model)
        if any(m is model for m in fp32):
            raise ValueError("the whole model is an fp32 module; nothing would run in "
                             f"{self.config.dtype}")
        for module in fp32:
            module.forward = _PrecisionForward(module, fp32=True, dtype=self.dtype)
        model.forward = _PrecisionForward(model, fp32=False, dtype=self.dtype)
        return model

    @staticmethod
    def remove(model: nn.Module) -> None:
        """Undo `apply`: every patched module gets its class's forward back."""
        for module in model.modules():
            if isinstance(module.__dict__.get("forward"), _PrecisionForward):
                del module.forward

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The matrix-work region, for code outside the model's forward."""
        return torch.autocast("cpu", dtype=self.dtype)

    def wrap_loss(self, loss: Callable[[M, Batch], torch.Tensor]
                  ) -> Callable[[M, Batch], torch.Tensor]:
        """``loss`` whose gradients carry the loss scale (the same loss without a scaler)."""
        scaler = self.scaler
        if scaler is None:
            return loss

        def scaled(model: M, batch: Batch) -> torch.Tensor:
            return scaler.scale_loss(loss(model, batch))

        return scaled

    def hooks(self, base: TrainHooks | None = None) -> TrainHooks:
        """``base`` (a parallel trainer's hooks) with, when there is a scaler, unscaling
        after its gradient reduction (so every rank checks reduced gradients) and before
        clipping, and the overflowing steps skipped.

        The scaler's state is not in `train_loop`'s checkpoints: a resumed fp16 run in a new
        process starts again from ``init_scale`` (save ``scaler.state_dict()`` beside it).
        """
        base = base or TrainHooks()
        scaler = self.scaler
        if scaler is None:
            return copy.copy(base)
        base_after = base.after_backward

        def after_backward(model: nn.Module) -> None:
            if base_after is not None:
                base_after(model)
            scaler.unscale_(model.parameters())

        base_skip = base.skip_step

        def skip_step(model: nn.Module) -> bool:
            overflow = scaler.update()
            base_skips = base_skip is not None and base_skip(model)
            return overflow or base_skips

        return TrainHooks(param_groups=base.param_groups, after_backward=after_backward,
                          clip_gradients=base.clip_gradients, skip_step=skip_step)


# -- memory ---------------------------------------------------------------------------------

def _matrix_weights(policy: MixedPrecision, model: nn.Module) -> list[nn.Parameter]:
    """Parameters that autocast copies to half precision and keeps for the backward pass:
    the weight matrices of matrix work outside the fp32 modules (not biases, which
    ``addmm``'s backward does not keep, and not embedding tables, which autocast leaves
    alone)."""
    fp32_params = {id(p) for m in policy.fp32_modules(model) for p in m.parameters()}
    embedding_params = {id(p) for m in model.modules()
                        if isinstance(m, (nn.Embedding, nn.EmbeddingBag))
                        for p in m.parameters()}
    # an MLPExperts bank stacks its experts: a matrix is 3-D there, its stacked biases 2-D
    stacked = {id(p) for m in model.modules() if isinstance(m, MLPExperts)
               for p in m.parameters()}
    return [p for p in model.parameters()
            if p.dim() >= (3 if id(p) in stacked else 2)
            and id(p) not in fp32_params and id(p) not in embedding_params]


@dataclass(frozen=True)
class MemoryAccount:
    """Model-state bytes of a model under a precision policy with Adam(W).

    Attributes:
        parameters: parameter elements P.
        parameter_tensors: parameter tensors (Adam keeps one fp32 step counter per tensor).
        matrix_elements: elements of the matrix weights autocast copies to half precision.
        paper: the paper's split (``BAGUALU_BYTES_PER_PARAM`` times P): bf16 weights and
            gradients, fp32 master and Adam m, v.
        autocast: our mechanism's split: fp32 weights (the master), fp32 gradients, Adam
            m, v and step counters, and the half-precision matrix copies that live from
            forward to backward.
    """

    parameters: int
    parameter_tensors: int
    matrix_elements: int
    paper: dict[str, int]
    autocast: dict[str, int]

    @property
    def paper_bytes_per_param(self) -> float:
        return sum(self.paper.values()) / self.parameters

    @property
    def autocast_persistent_bytes(self) -> int:
        """What stays between steps (all but the half-precision copies)."""
        return sum(v for k, v in self.autocast.items() if k != "half_copies")


def account_memory(model: nn.Module, policy: MixedPrecision | None = None) -> MemoryAccount:
    """The model-state bytes of ``model`` trained with Adam under ``policy`` (default bf16)."""
    policy = policy or MixedPrecision()
    params = list(model.parameters())
    P = sum(p.numel() for p in params)
    half = torch.empty((), dtype=policy.dtype).element_size()
    matrix = sum(p.numel() for p in _matrix_weights(policy, model))
    paper = {k: v * P for k, v in BAGUALU_BYTES_PER_PARAM.items()}
    autocast = {"fp32_weights": 4 * P, "fp32_grads": 4 * P, "adam_m": 4 * P, "adam_v": 4 * P,
                "adam_step": 4 * len(params), "half_copies": half * matrix}
    return MemoryAccount(parameters=P, parameter_tensors=len(params), matrix_elements=matrix,
                         paper=paper, autocast=autocast)


@dataclass(frozen=True)
class MemoryMeasurement:
    """Storage bytes of the real tensors after one training step, by what they hold.

    Attributes:
        by_dtype: parameter bytes per dtype name (all fp32 under the policy).
        fp32_weights, fp32_grads: parameter and gradient storage.
        adam_m, adam_v, adam_step: the optimizer state ``exp_avg``, ``exp_avg_sq``, ``step``.
        optimizer_dtypes: the dtypes found in the optimizer state.
        half_copies: distinct storages of half-precision copies of parameters that the
            forward pass saved for the backward pass.
    """

    by_dtype: dict[str, int]
    fp32_weights: int
    fp32_grads: int
    adam_m: int
    adam_v: int
    adam_step: int
    optimizer_dtypes: frozenset[str]
    half_copies: int

    def as_account(self) -> dict[str, int]:
        """The same keys as `MemoryAccount.autocast`."""
        return {"fp32_weights": self.fp32_weights, "fp32_grads": self.fp32_grads,
                "adam_m": self.adam_m, "adam_v": self.adam_v, "adam_step": self.adam_step,
                "half_copies": self.half_copies}


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


_VIEW_BACKWARDS = frozenset({"SelectBackward0", "ViewBackward0", "TBackward0",
                             "TransposeBackward0", "SliceBackward0", "PermuteBackward0",
                             "UnsafeViewBackward0", "AliasBackward0", "ExpandBackward0"})


def _copied_parameter(t: torch.Tensor) -> torch.Tensor | None:
    """The parameter ``t`` is a half-precision copy of (through views), else None."""
    fn = t.grad_fn
    cast = False
    while fn is not None:
        name = type(fn).__name__
        if name == "AccumulateGrad":
            variable: torch.Tensor = fn.variable  # type: ignore[attr-defined]
            return variable if cast else None
        if name == "ToCopyBackward0":
            cast = True
        elif name not in _VIEW_BACKWARDS:
            return None
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return None


@contextlib.contextmanager
def _half_copies_saved(found: list[torch.Tensor]) -> Iterator[None]:
    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype in (torch.bfloat16, torch.float16) and _copied_parameter(t) is not None:
            found.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def measure_memory(model: nn.Module, loss: Callable[[nn.Module], torch.Tensor],
                   optimizer: torch.optim.Optimizer) -> MemoryMeasurement:
    """Run one step of ``loss(model)`` and ``optimizer``; count the storage it leaves.

    The half-precision copies are counted as the forward pass saves them (distinct
    storages), since autocast frees them once the backward pass has used them.
    """
    found: list[torch.Tensor] = []
    optimizer.zero_grad(set_to_none=True)
    with _half_copies_saved(found):
        value = loss(model)
    half = _storage_bytes(found)
    found.clear()
    value.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    params = list(model.parameters())
    by_dtype: dict[str, int] = {}
    for p in params:
        key = str(p.dtype).removeprefix("torch.")
        by_dtype[key] = by_dtype.get(key, 0) + p.untyped_storage().nbytes()
    state = [optimizer.state[p] for p in params if p in optimizer.state]
    dtypes = frozenset(str(t.dtype).removeprefix("torch.") for s in state for t in s.values()
                       if isinstance(t, torch.Tensor))
    return MemoryMeasurement(
        by_dtype=by_dtype,
        fp32_weights=_storage_bytes(p for p in params if p.dtype == torch.float32),
        fp32_grads=_storage_bytes(p.grad for p in params
                                  if p.grad is not None and p.grad.dtype == torch.float32),
        adam_m=_storage_bytes(s["exp_avg"] for s in state),
        adam_v=_storage_bytes(s["exp_avg_sq"] for s in state),
        adam_step=_storage_bytes(s["step"] for s in state),
        optimizer_dtypes=dtypes, half_copies=half)


# -- speed ----------------------------------------------------------------------------------

def cpu_half_precision_features() -> tuple[str, ...]:
    """This CPU's bf16/fp16 matrix features from /proc/cpuinfo (empty if none or unknown)."""
    wanted = ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(w for w in wanted if w in flags)
    except OSError:
        return ()
    return ()


@dataclass(kw_only=True)
class PrecisionSpeedConfig:
    """The MoE transformer and the measurement of `measure_precision_speed`.

    Attributes:
        model: the `furnace.moe.MoETransformerLM` timed.
        batch: sequences per step (of ``model.seq_len`` tokens).
        dtype: the half precision timed against fp32.
        rounds: timed rounds (one step of each precision per round, order rotating).
        warmup: untimed rounds first.
        num_threads: torch intra-op threads during the measurement.
        seed: model initialisation and the batch.
    """

    model: MoELMConfig = field(default_factory=lambda: MoELMConfig(
        vocab_size=256, d_model=128, num_layers=2, num_heads=4, seq_len=64, num_experts=4,
        top_k=2, d_hidden=512))
    batch: int = 8
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    rounds: int = 7
    warmup: int = 1
    num_threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch < 1 or self.rounds < 1 or self.warmup < 0 or self.num_threads < 1:
            raise ValueError("batch, rounds and num_threads must be >= 1 and warmup >= 0")


@dataclass(frozen=True)
class PrecisionSpeed:
    """Forward+backward step time of the same model in fp32 and in half precision.

    Attributes:
        fp32, half: the step times (seconds), sample i of both from round i.
        ratio: median over rounds of half / fp32 step time (< 1: half precision is faster).
        dtype: the half precision.
        cpu_features: the CPU's bf16/fp16 matrix features; without them bf16 GEMMs are
            emulated and may be slower than fp32.
        tokens: tokens per step.
    """

    fp32: Timing
    half: Timing
    ratio: float
    dtype: str
    cpu_features: tuple[str, ...]
    tokens: int

    @property
    def speedup(self) -> float:
        """fp32 time over half-precision time (> 1: half precision is faster)."""
        return 1.0 / self.ratio


def measure_precision_speed(config: PrecisionSpeedConfig | None = None) -> PrecisionSpeed:
    """Time one forward+backward step of a small MoE transformer in fp32 and in half
    precision, side by side (`furnace.runtime.timing.round_robin`, `median_paired_ratio`).

    Both models have the same initial weights and see the same batch. A measured figure,
    reported as it comes: no claim that half precision is faster on this CPU.
    """
    config = config or PrecisionSpeedConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        fp32_model = MoETransformerLM(config.model)
        idx_BT = torch.randint(0, config.model.vocab_size,
                               (config.batch, config.model.seq_len + 1))
    half_model = MixedPrecision(MixedPrecisionConfig(dtype=config.dtype)).apply(
        copy.deepcopy(fp32_model))
    models = {"fp32": fp32_model, config.dtype: half_model}
    inputs_BT, targets_BT = idx_BT[:, :-1], idx_BT[:, 1:]

    def step(name: str) -> float:
        model = models[name]
        model.zero_grad(set_to_none=True)
        with stopwatch() as lap:
            _, loss = model(inputs_BT, targets_BT)
            assert loss is not None
            loss.backward()
        return lap.seconds

    with torch_threads(config.num_threads):
        samples = round_robin(list(models), step, rounds=config.rounds, warmup=config.warmup)
    fp32 = Timing(tuple(samples["fp32"]), warmup=config.warmup, num_threads=config.num_threads)
    half = Timing(tuple(samples[config.dtype]), warmup=config.warmup,
                  num_threads=config.num_threads)
    return PrecisionSpeed(fp32=fp32, half=half, ratio=median_paired_ratio(half, fp32),
                          dtype=config.dtype, cpu_features=cpu_half_precision_features(),
                          tokens=config.batch * config.model.seq_len)
