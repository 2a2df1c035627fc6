"""Expert banks: the experts of a layer held by one process (FastMoE's fused experts and its
per-module experts; FasterMoE section 2, and 4.1 for the shadow replicas).

An `ExpertBank` holds ``num_experts`` consecutive global experts starting at
``first_expert``: all of them in one process, or one rank's share under expert
parallelism. The expert-parallel layer needs three things of a bank, whatever the experts
are: the parameter tensors (``param_tensors``), one expert's slice of any list shaped like
them (``expert_params``), and a pure function that runs one expert with given parameters
(``apply_expert``), so a shadow replica computes exactly what its owner would.

- `MLPExperts`: FastMoE's `FMoETransformerMLP` experts, 2-layer MLPs H -> F -> H stored as
  stacked tensors with a leading expert dimension (sharding is slicing).
- `ModuleExperts`: any ``nn.Module`` per expert (FastMoE's ``expert=`` class), run
  with `torch.func.functional_call` when the parameters are a replica's.

Initialization can be made per expert: with ``init_seed`` (or `seeded`), global expert e
draws its weights from its own generator (`expert_seed`), so a rank that builds only its
own experts gets the same weights as one process that builds them all.

Shape suffixes: E = experts in the bank, D = d_model, F = d_hidden, R = rows (tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}

_MASK64 = (1 << 64) - 1


def expert_seed(base_seed: int, expert: int) -> int:
    """The initialization seed of global expert ``expert``, derived from ``base_seed``.

    A splitmix64 finaliser (Steele, Lea and Flood, OOPSLA 2014) of ``base + (e + 1) * phi``,
    so neighbouring ids get unrelated streams; the result fits ``torch.Generator``.
    """
    z = (int(base_seed) + (int(expert) + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def draw_base_seed() -> int:
    """A base seed drawn from torch's global CPU generator (same on ranks seeded alike)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def seeded(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with the global CPU generator set to ``seed``, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


class ExpertBank(nn.Module):
    """The experts of one layer held here: global ids ``first_expert .. first_expert+E-1``.

    Subclasses implement `param_tensors`, `expert_params`, `apply_expert`, `shard` and
    `flops_per_token`; `forward` runs contiguous row blocks through the experts in order.
    """

    num_experts: int
    d_model: int
    first_expert: int

    def param_tensors(self) -> list[torch.Tensor]:
        """Every parameter of the bank, in a fixed order (the autograd leaves of a step)."""
        raise NotImplementedError

    def expert_params(self, local_expert: int,
                      tensors: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Local expert ``local_expert``'s part of ``tensors`` (default: the parameters).

        ``tensors`` is any list shaped like `param_tensors` (e.g. its gradients); the
        parts are views, so in-place updates reach it.
        """
        raise NotImplementedError

    def apply_expert(self, params: Sequence[torch.Tensor], x_RD: torch.Tensor,
                     local_expert: int = 0) -> torch.Tensor:
        """One expert on rows ``x_RD`` with parameters ``params``.

        ``local_expert`` names the local expert whose structure the parameters fit (a
        shadow replica of global expert e uses ``e % num_experts``: experts at the same
        local index have the same structure on every rank).
        """
        raise NotImplementedError

    def shard(self, first: int, count: int) -> ExpertBank:
        """A bank with experts ``first .. first+count-1`` of this one."""
        raise NotImplementedError

    def flops_per_token(self) -> int:
        """Forward FLOPs of one expert on one token (for the performance model)."""
        raise NotImplementedError

    def forward(self, x_RD: torch.Tensor, rows_per_expert: Sequence[int]) -> torch.Tensor:
        """Apply expert e to the e-th contiguous block of rows (FastMoE's fused-expert call)."""
        if len(rows_per_expert) != self.num_experts:
            raise ValueError(f"need {self.num_experts} row counts, got {len(rows_per_expert)}")
        outs = []
        for e, x_e in enumerate(torch.split(x_RD, [int(r) for r in rows_per_expert])):
            outs.append(self.run_local(e, x_e) if x_e.shape[0]
                        else x_e.new_zeros((0, self.d_model)))
        return torch.cat(outs) if outs else x_RD.new_zeros((0, self.d_model))

    def run_local(self, local_expert: int, x_RD: torch.Tensor) -> torch.Tensor:
        """Local expert ``local_expert`` with its own parameters."""
        return self.apply_expert(self.expert_params(local_expert), x_RD, local_expert)

    @property
    def dtype(self) -> torch.dtype:
        return self.param_tensors()[0].dtype

    def equivalent_d_hidden(self) -> int:
        """The F of a 2-layer MLP with this bank's FLOPs per token (4*H*F)."""
        return max(1, round(self.flops_per_token() / (4 * self.d_model)))

    def param_bytes_per_expert(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.expert_params(0))


class MLPExperts(ExpertBank):
    """``num_experts`` independent MLPs ``x -> act(x W1 + b1) W2 + b2``.

    Args:
        num_experts: experts held by this bank (all of them in one process, or one
            rank's share once expert parallelism is applied).
        d_model: input and output width H.
        d_hidden: hidden width alpha*H.
        activation: "gelu", "relu" or "silu".
        first_expert: global id of the bank's first expert (its offset in the layer).
        init_seed: None draws every weight from torch's global generator (nn.Linear's
            init per expert); an int gives global expert e its own generator seeded with
            ``expert_seed(init_seed, e)``, so any slice of the experts can be built alone.
    """

    def __init__(self, num_experts: int, d_model: int, d_hidden: int, *,
                 activation: str = "gelu", first_expert: int = 0,
                 dtype: torch.dtype | None = None, init_seed: int | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")
        self.num_experts = num_experts
        self.d_model = d_model
        self.d_hidden = d_hidden
        self.activation = activation
        self.first_expert = first_expert
        self.init_seed = init_seed
        self.w1_EDF = nn.Parameter(torch.empty(num_experts, d_model, d_hidden, dtype=dtype))
        self.b1_EF = nn.Parameter(torch.empty(num_experts, d_hidden, dtype=dtype))
        self.w2_EFD = nn.Parameter(torch.empty(num_experts, d_hidden, d_model, dtype=dtype))
        self.b2_ED = nn.Parameter(torch.empty(num_experts, d_model, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default init, per expert
        pairs = ((self.w1_EDF, self.b1_EF, self.d_model), (self.w2_EFD, self.b2_ED, self.d_hidden))
        if self.init_seed is None:
            for w, b, fan_in in pairs:
                bound = 1.0 / math.sqrt(fan_in)
                nn.init.uniform_(w, -bound, bound)
                nn.init.uniform_(b, -bound, bound)
            return
        for e in range(self.num_experts):
            gen = torch.Generator().manual_seed(expert_seed(self.init_seed, self.first_expert + e))
            with torch.no_grad():
                for w, b, fan_in in pairs:
                    bound = 1.0 / math.sqrt(fan_in)
                    for t in (w[e], b[e]):
                        t.copy_(torch.empty(t.shape, dtype=torch.float64, device="cpu")
                                .uniform_(-bound, bound, generator=gen))

    def param_tensors(self) -> list[torch.Tensor]:
        """The stacked parameters, each with the expert dimension first."""
        return [self.w1_EDF, self.b1_EF, self.w2_EFD, self.b2_ED]

    def expert_params(self, local_expert: int,
                      tensors: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        return [p[local_expert] for p in (self.param_tensors() if tensors is None else tensors)]

    def apply_expert(self, params: Sequence[torch.Tensor], x_RD: torch.Tensor,
                     local_expert: int = 0) -> torch.Tensor:
        """One expert's MLP on rows ``x_RD`` with parameters ``params`` (one slice each)."""
        w1_DF, b1_F, w2_FD, b2_D = params
        return torch.addmm(b2_D, ACTIVATIONS[self.activation](torch.addmm(b1_F, x_RD, w1_DF)),
                           w2_FD)

    def flops_per_token(self) -> int:
        """Forward FLOPs per token: two GEMMs of 2*H*F each (4*alpha*H^2)."""
        return 4 * self.d_model * self.d_hidden

    def equivalent_d_hidden(self) -> int:
        return self.d_hidden

    def shard(self, first: int, count: int) -> MLPExperts:
        """A bank holding experts ``first .. first+count-1`` of this one (copied)."""
        out = MLPExperts(count, self.d_model, self.d_hidden, activation=self.activation,
                         first_expert=self.first_expert + first, dtype=self.w1_EDF.dtype,
                         init_seed=self.init_seed)
        with torch.no_grad():
            for dst, src in zip(out.param_tensors(), self.param_tensors()):
                dst.copy_(src[first:first + count])
        return out

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, d_model={self.d_model}, "
                f"d_hidden={self.d_hidden}, activation={self.activation}, "
                f"first_expert={self.first_expert}")


class ModuleExperts(ExpertBank):
    """One ``nn.Module`` per expert, each mapping [R, d_model] rows to [R, d_model].

    Args:
        modules: the local experts, in global-id order from ``first_expert``; they are
            registered as children "0", "1", ... (FastMoE's ``experts.<i>.`` keys).
        d_model: token width.
        first_expert: global id of the first module.
        call_with_count: call each module as ``module(x, count)`` with ``count`` a
            one-element int64 tensor of its rows, as FastMoE calls its experts; otherwise
            ``module(x)``.
        flops_per_token: forward FLOPs of one expert per token, for the performance
            model only; default 2 per parameter (one multiply-add per weight, exact for
            a stack of bias-free linear layers).

    Experts must not share parameters. A shadow replica runs the module at the same local
    index with the owner's parameters, so modules at one local index must have the same
    parameter shapes on every rank (FastMoE builds them from the same class).
    """

    def __init__(self, modules: Sequence[nn.Module], d_model: int, *, first_expert: int = 0,
                 call_with_count: bool = False, flops_per_token: int | None = None) -> None:
        super().__init__()
        modules = list(modules)
        if not modules:
            raise ValueError("ModuleExperts needs at least one expert module")
        seen: set[int] = set()
        self._names: list[list[str]] = []
        for i, module in enumerate(modules):
            if not isinstance(module, nn.Module):
                raise ValueError(f"expert {i} is a {type(module).__name__}, not an nn.Module")
            named = list(module.named_parameters())
            if any(id(p) in seen for _, p in named):
                raise ValueError(f"expert {i} shares a parameter with an earlier expert; "
                                 "each expert needs its own parameters")
            seen.update(id(p) for _, p in named)
            self._names.append([n for n, _ in named])
            self.add_module(str(i), module)
        self.num_experts = len(modules)
        self.d_model = d_model
        self.first_expert = first_expert
        self.call_with_count = call_with_count
        self._flops = flops_per_token
        self._offsets = [0]
        for names in self._names:
            self._offsets.append(self._offsets[-1] + len(names))

    def __getitem__(self, i: int) -> nn.Module:
        return cast(nn.Module, self._modules[str(range(self.num_experts)[i])])

    def __len__(self) -> int:
        return self.num_experts

    def __iter__(self) -> Iterator[nn.Module]:
        return (cast(nn.Module, self._modules[str(i)]) for i in range(self.num_experts))

    def param_tensors(self) -> list[torch.Tensor]:
        return [p for module in self for p in module.parameters()]

    def expert_params(self, local_expert: int,
                      tensors: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        if tensors is None:
            return list(self[local_expert].parameters())
        return list(tensors[self._offsets[local_expert]:self._offsets[local_expert + 1]])

    def _call(self, module: nn.Module, x_RD: torch.Tensor, params=None) -> torch.Tensor:
        args: tuple[torch.Tensor, ...] = (x_RD,)
        if self.call_with_count:
            args = (x_RD, torch.tensor([x_RD.shape[0]], dtype=torch.int64))
        if params is None:
            return module(*args)
        return torch.func.functional_call(module, params, args)

    def apply_expert(self, params: Sequence[torch.Tensor], x_RD: torch.Tensor,
                     local_expert: int = 0) -> torch.Tensor:
        module = self[local_expert]
        names = self._names[local_expert]
        if len(params) != len(names):
            raise ValueError(f"expert {local_expert} has {len(names)} parameters, "
                             f"got {len(params)}")
        return self._call(module, x_RD, dict(zip(names, params)))

    def run_local(self, local_expert: int, x_RD: torch.Tensor) -> torch.Tensor:
        # the module's own forward, so its hooks and buffers behave as in plain PyTorch
        return self._call(self[local_expert], x_RD)

    def flops_per_token(self) -> int:
        if self._flops is not None:
            return int(self._flops)
        return 2 * sum(p.numel() for p in self.expert_params(0))

    def shard(self, first: int, count: int) -> ModuleExperts:
        """A bank of modules ``first .. first+count-1`` (the same modules, not copies)."""
        return ModuleExperts(list(self)[first:first + count], self.d_model,
                             first_expert=self.first_expert + first,
                             call_with_count=self.call_with_count, flops_per_token=self._flops)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, d_model={self.d_model}, "
                f"first_expert={self.first_expert}")
