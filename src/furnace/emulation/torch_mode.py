"""Run an unchanged PyTorch model with every float32 matmul done by an emulated GEMM.

Ape (Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, "Efficiently Emulating High-Bitwidth
Computation with Low-Bitwidth Hardware", ICS '22) replaces the FP32 GEMMs of a program by
emulated ones built from low-bitwidth matrix-unit products. This PyTorch-level integration is
ours, not the paper's (design note `emulated_types.md` section 6.6, MLP row): a
`torch.overrides.TorchFunctionMode` catches the matmul family on float32 tensors and sends
each 2-D product through a caller's ``gemm(A, B) -> C`` (2-D float32 numpy in and out), for
example ``types.get_type("BF16").gemm`` on a `DSA`. A custom autograd function makes the
backward pass use the same GEMM (dA = dC B^T, dB = A^T dC), so training behaves as it would
on the modelled accelerator.

Intercepted (float32 operands only): ``torch.matmul`` / ``Tensor.matmul`` / ``@``
(``__matmul__``, ``__rmatmul__``), ``torch.linalg.matmul``, ``mm``, ``bmm``, ``mv``, ``dot``,
``addmm``, ``baddbmm``, ``torch.nn.functional.linear`` and
``torch.nn.functional.scaled_dot_product_attention``. SDPA is a single C++ op whose inner
matmuls never reach a Python mode, so it is rewritten here as softmax(Q K^T * scale + mask) V
with two emulated matmuls (no fused kernel, so memory is O(L * S) per head).

Not intercepted: any call whose tensors are not all float32 runs natively and untouched
(float64 references, integer or half-precision work), because the emulated types model FP32
GEMMs. GEMM-like ops this module does not rewrite (einsum, tensordot, convolutions, in-place
``addmm_`` ...) also run natively; on float32 data they are tallied in ``mode.bypassed``, and
``strict=True`` makes them raise instead. One of them matters for "unchanged" models:
``nn.MultiheadAttention`` (and so ``nn.Transformer*``) calls
``F.multi_head_attention_forward``, a Python function that hands itself to the active mode;
whatever the mode does, its body then runs with the mode switched off, so none of its
products can be emulated. Attention written with ``nn.Linear`` and
``F.scaled_dot_product_attention`` (or explicit matmuls) is fully routed.

NaN and infinities propagate as in native torch: the catalogue's types give the NaN / inf
entries a native GEMM gives (`types.ieee_nonfinite_products`), forward and backward. A type
that cannot vouch for a product (`types.RangeError`, e.g. FP32-F on a row whose magnitudes
spread beyond fp16's) raises instead of returning it.

Batched and broadcast products are looped over the batch in Python, which is fine for the
small models this is meant for. A gemm that returns anything but a float32 array of the right
shape raises `EmulatedGemmError` (a RuntimeError: ``a @ b`` turns a TypeError into "unsupported
operand", which would hide the cause).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

Gemm = Callable[[np.ndarray, np.ndarray], np.ndarray]

__all__ = ["EmulatedGemmError", "EmulatedMatmulMode", "Gemm", "emulated_matmul", "gemm_from_type"]


class EmulatedGemmError(RuntimeError):
    """The emulated gemm broke its contract (float32 array of shape (m, n))."""


def gemm_from_type(type_name: str, dsa=None) -> Gemm:
    """``gemm(A, B)`` for the emulated type ``type_name`` (e.g. "BF16", "FP32-B") on ``dsa``.

    ``types`` is imported here, not at module import, so this module works (with any
    callable) even where the type catalogue is absent. ``dsa`` defaults to ``DSA("toy")``.
    """
    from furnace.emulation.dsa import DSA

    try:
        from furnace.emulation.types import get_type
    except ImportError as err:
        raise ImportError(
            "furnace.emulation.types is not available; pass a gemm callable instead of a "
            f"type name ({err})"
        ) from err
    gemm = _type_gemm(get_type(type_name), DSA("toy") if dsa is None else dsa)
    gemm.__name__ = f"gemm_{type_name}"
    return gemm


def _type_gemm(emulated, device) -> Gemm:
    """``gemm(a, b)`` of an object with ``.gemm(A, B, dsa)``, float32 out.

    An fp64-class type (Ozaki, DF32) takes the float32 operands exactly and its more
    accurate product is rounded once to the float32 result torch expects; INT16 takes
    integers, which a float32 matmul never passes, so it is refused here rather than at
    the first product.
    """
    family = getattr(emulated, "family", None)
    if family == "int16":
        raise ValueError(
            f"{getattr(emulated, 'name', 'INT16')} multiplies integers; emulated_matmul "
            "routes float32 matmuls: choose a float type (e.g. FP32-F, FP32-B, OZ2-N12)"
        )

    def gemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = emulated.gemm(a, b, device)
        if family == "fp64":
            out = np.asarray(out).astype(np.float32)
        return out

    return gemm


class _Stats:
    """Counts shared by a mode and the autograd nodes it created.

    Backward runs whenever ``loss.backward()`` is called, possibly after the ``with`` block
    has ended; the nodes keep a reference to this object so those GEMMs are still counted.
    """

    def __init__(self) -> None:
        self.gemm_calls = 0
        self.backward_gemm_calls = 0


def _run_gemm(gemm: Gemm, a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """One 2-D product through ``gemm``, checked so a float64 leak or a bad shape is loud."""
    a_np = np.ascontiguousarray(a.detach().cpu().numpy())
    b_np = np.ascontiguousarray(b.detach().cpu().numpy())
    m, n = a_np.shape[0], b_np.shape[1]
    if a_np.shape[1] == 0:
        # an empty sum; emulated types need not handle k = 0, and the answer is not in doubt
        return np.zeros((m, n), dtype=np.float32)
    out = gemm(a_np, b_np)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise EmulatedGemmError(
            f"the emulated gemm must return a float32 numpy array, got "
            f"{getattr(out, 'dtype', type(out).__name__)}"
        )
    if out.shape != (m, n):
        raise EmulatedGemmError(
            f"the emulated gemm returned shape {out.shape} for {a_np.shape} @ "
            f"{b_np.shape}; expected {(m, n)}"
        )
    return out


def _batched(
    gemm: Gemm, a: torch.Tensor, b: torch.Tensor, stats: _Stats, backward: bool
) -> torch.Tensor:
    """(N, m, k) @ (N, k, n) as N calls of ``gemm``; float32 result on a's device."""
    count, m, n = a.shape[0], a.shape[1], b.shape[2]
    out = np.empty((count, m, n), dtype=np.float32)
    for i in range(count):
        if m and n:
            out[i] = _run_gemm(gemm, a[i], b[i])
            stats.gemm_calls += 1
            stats.backward_gemm_calls += int(backward)
    return torch.from_numpy(out).to(a.device)


class _EmulatedBMM(torch.autograd.Function):
    """Batched product whose forward and backward both use the emulated GEMM.

    The numpy round trip is opaque to autograd, so the gradients are written out here; they
    are the ones an accelerator running this type would compute. ``once_differentiable``:
    double backward through a numpy GEMM is not supported.
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, gemm: Gemm, stats: _Stats):
        ctx.save_for_backward(a, b)
        ctx.gemm = gemm
        ctx.stats = stats
        return _batched(gemm, a, b, stats, backward=False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        # skip the product nobody needs, as a real training step would (inputs rarely
        # need gradients, so this halves the work of a first layer)
        if ctx.needs_input_grad[0]:
            grad_a = _batched(ctx.gemm, grad, b.transpose(1, 2), ctx.stats, backward=True)
        if ctx.needs_input_grad[1]:
            grad_b = _batched(ctx.gemm, a.transpose(1, 2), grad, ctx.stats, backward=True)
        return grad_a, grad_b, None, None


def _is_f32(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tensors)


class EmulatedMatmulMode(TorchFunctionMode):
    """Context manager routing float32 matmuls through ``gemm``; see the module docstring.

    Attributes: ``calls`` (Counter of intercepted calls by op name), ``bypassed`` (Counter of
    GEMM-like float32 ops that ran natively), ``gemm_calls`` / ``backward_gemm_calls`` (2-D
    emulated GEMMs run so far, the latter in backward passes), ``dsa`` (the device, when the
    mode was built from a type name; else None).
    """

    def __init__(self, gemm: Gemm, *, strict: bool = False, dsa=None) -> None:
        super().__init__()
        if not callable(gemm):
            raise TypeError(f"gemm must be callable as gemm(A, B), got {type(gemm).__name__}")
        self.gemm = gemm
        self.strict = strict
        self.dsa = dsa
        self.calls: Counter[str] = Counter()
        self.bypassed: Counter[str] = Counter()
        self._stats = _Stats()
        self._handlers = self._handler_table()

    @property
    def gemm_calls(self) -> int:
        return self._stats.gemm_calls

    @property
    def backward_gemm_calls(self) -> int:
        return self._stats.backward_gemm_calls

    # --- dispatch ------------------------------------------------------------------------

    def _handler_table(self) -> dict[Any, tuple[str, Callable[..., Any]]]:
        table: dict[Any, tuple[str, Callable[..., Any]]] = {}
        for func in (
            torch.matmul,
            torch.Tensor.matmul,
            torch.Tensor.__matmul__,
            torch.linalg.matmul,
        ):
            table[func] = ("matmul", self._matmul_call)
        table[torch.Tensor.__rmatmul__] = ("matmul", self._rmatmul_call)
        for func in (torch.mm, torch.Tensor.mm):
            table[func] = ("mm", self._mm)
        for func in (torch.bmm, torch.Tensor.bmm):
            table[func] = ("bmm", self._bmm)
        for func in (torch.mv, torch.Tensor.mv):
            table[func] = ("mv", self._mv)
        for func in (torch.dot, torch.Tensor.dot):
            table[func] = ("dot", self._dot)
        for func in (torch.addmm, torch.Tensor.addmm):
            table[func] = ("addmm", self._addmm)
        for func in (torch.baddbmm, torch.Tensor.baddbmm):
            table[func] = ("baddbmm", self._baddbmm)
        table[F.linear] = ("linear", self._linear)
        table[F.scaled_dot_product_attention] = ("scaled_dot_product_attention", self._sdpa)
        return table

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = self._handlers.get(func)
        if entry is None:
            self._note_bypass(func, args, kwargs)
            return func(*args, **kwargs)
        name, handler = entry
        # boolean masks (SDPA) do not decide whether the arithmetic is FP32
        tensors = [
            x
            for x in (*args, *kwargs.values())
            if isinstance(x, torch.Tensor) and x.dtype != torch.bool
        ]
        if not tensors or not _is_f32(*tensors):
            # only FP32 GEMMs are being emulated; anything else is someone else's arithmetic
            return func(*args, **kwargs)
        if kwargs.get("out") is not None:
            raise NotImplementedError(
                f"emulated {name}: out= is not supported; assign the result instead"
            )
        kwargs.pop("out", None)
        self.calls[name] += 1
        # the mode is switched off while this runs, so the torch ops used below are native
        return handler(*args, **kwargs)

    def _note_bypass(self, func, args, kwargs) -> None:
        name = _BYPASS_NAMES.get(func)
        if name is None:
            return
        values = [*args, *kwargs.values()]
        for value in list(values):
            if isinstance(value, (list, tuple)):
                values.extend(value)
        if not any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in values):
            return
        if self.strict:
            raise NotImplementedError(
                f"{name} on float32 tensors is not routed through the emulated GEMM; "
                "rewrite it with matmul or use strict=False to let it run natively"
            )
        self.bypassed[name] += 1

    # --- the core product ------------------------------------------------------------------

    def _product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(..., m, k) @ (..., k, n), both at least 2-D, with torch's batch broadcasting."""
        m, k = a.shape[-2], a.shape[-1]
        if b.shape[-2] != k:
            raise RuntimeError(
                f"emulated matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} "
                "cannot be multiplied (inner dimensions differ)"
            )
        n = b.shape[-1]
        if b.ndim == 2:
            # a plain weight: fold every leading dimension of a into rows, one GEMM as torch
            # does for nn.Linear on (batch, seq, features) input
            rows = a.reshape(1, -1, k)
            out = _EmulatedBMM.apply(rows, b.unsqueeze(0), self.gemm, self._stats)
            return out.reshape(*a.shape[:-1], n)
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        # expand is differentiable (its backward sums over the broadcast dimensions), so the
        # autograd function only ever sees equal batches
        a3 = a.expand(*batch, m, k).reshape(-1, m, k)
        b3 = b.expand(*batch, k, n).reshape(-1, k, n)
        out = _EmulatedBMM.apply(a3, b3, self.gemm, self._stats)
        return out.reshape(*batch, m, n)

    def _matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.ndim == 0 or b.ndim == 0:
            raise RuntimeError(
                "both arguments to matmul need to be at least 1D, got shapes "
                f"{tuple(a.shape)} and {tuple(b.shape)}"
            )
        # 1-D operands follow torch.matmul: a vector on the left is a row (its dimension is
        # dropped from the result), on the right a column
        a2 = a.unsqueeze(0) if a.ndim == 1 else a
        b2 = b.unsqueeze(-1) if b.ndim == 1 else b
        out = self._product(a2, b2)
        if b.ndim == 1:
            out = out.squeeze(-1)
        if a.ndim == 1:
            out = out.squeeze(-1 if b.ndim == 1 else -2)
        return out

    # --- handlers, one per public signature ----------------------------------------------------

    def _matmul_call(self, input, other):
        return self._matmul(input, other)

    def _rmatmul_call(self, input, other):
        # Tensor.__rmatmul__(self, other) computes other @ self
        return self._matmul(other, input)

    def _mm(self, input, mat2):
        if input.ndim != 2 or mat2.ndim != 2:
            raise RuntimeError(
                f"mm takes 2-D matrices, got shapes {tuple(input.shape)} and {tuple(mat2.shape)}"
            )
        return self._product(input, mat2)

    def _bmm(self, input, mat2):
        if input.ndim != 3 or mat2.ndim != 3 or input.shape[0] != mat2.shape[0]:
            raise RuntimeError(
                "bmm takes two 3-D tensors with the same batch size, got "
                f"shapes {tuple(input.shape)} and {tuple(mat2.shape)}"
            )
        return self._product(input, mat2)

    def _mv(self, input, vec):
        if input.ndim != 2 or vec.ndim != 1:
            raise RuntimeError(
                f"mv takes a matrix and a vector, got shapes "
                f"{tuple(input.shape)} and {tuple(vec.shape)}"
            )
        return self._matmul(input, vec)

    def _dot(self, input, tensor):
        if input.ndim != 1 or tensor.ndim != 1:
            raise RuntimeError(
                f"dot takes two 1-D tensors, got shapes {tuple(input.shape)} "
                f"and {tuple(tensor.shape)}"
            )
        return self._matmul(input, tensor)

    @staticmethod
    def _scale_add(input, product, beta, alpha):
        # beta * input + alpha * product on the FP32 vector unit; beta == 0 ignores input
        # entirely (NaN in it does not propagate), as torch documents for addmm
        if alpha != 1:
            product = product * alpha
        if beta == 0:
            return product.expand(torch.broadcast_shapes(input.shape, product.shape)).clone()
        return product + (input if beta == 1 else input * beta)

    def _addmm(self, input, mat1, mat2, *, beta=1, alpha=1):
        return self._scale_add(input, self._mm(mat1, mat2), beta, alpha)

    def _baddbmm(self, input, batch1, batch2, *, beta=1, alpha=1):
        return self._scale_add(input, self._bmm(batch1, batch2), beta, alpha)

    def _linear(self, input, weight, bias=None):
        out = self._matmul(input, weight.t() if weight.ndim == 2 else weight)
        return out if bias is None else out + bias

    def _sdpa(
        self,
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
    ):
        # the math PyTorch documents for scaled_dot_product_attention, with both products
        # emulated; the softmax and masking stay float32 vector work
        if is_causal and attn_mask is not None:
            raise RuntimeError(
                "scaled_dot_product_attention: attn_mask and is_causal cannot both be set"
            )
        length, source = query.shape[-2], key.shape[-2]
        factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        if enable_gqa:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        scores = self._matmul(query, key.transpose(-2, -1)) * factor
        if is_causal:
            keep = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        elif attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask
        weights = torch.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = torch.dropout(weights, dropout_p, train=True)
        return self._matmul(weights, value)


def _bypass_names() -> dict[Any, str]:
    """GEMM-like functions that are not rewritten, for ``bypassed`` and ``strict``."""
    names: dict[Any, str] = {}
    candidates: dict[str, list[Any]] = {
        "einsum": [torch.einsum],
        "tensordot": [torch.tensordot],
        "inner": [torch.inner, torch.Tensor.inner],
        "outer": [torch.outer, torch.Tensor.outer],
        "addmv": [torch.addmv, torch.Tensor.addmv],
        "addbmm": [torch.addbmm, torch.Tensor.addbmm],
        "addmm_": [torch.Tensor.addmm_],
        "baddbmm_": [torch.Tensor.baddbmm_],
        "multi_dot": [torch.linalg.multi_dot],
        "bilinear": [F.bilinear],
        "conv1d": [F.conv1d],
        "conv2d": [F.conv2d],
        "conv3d": [F.conv3d],
        # a Python function that itself asks the mode to handle it, after which its body
        # runs with the mode off; its products cannot be reached from here
        "multi_head_attention_forward": [F.multi_head_attention_forward],
    }
    for name, funcs in candidates.items():
        for func in funcs:
            names[func] = name
    return names


_BYPASS_NAMES = _bypass_names()


def emulated_matmul(
    type_or_gemm: str | Gemm | Any, dsa=None, *, strict: bool = False
) -> EmulatedMatmulMode:
    """A context manager running float32 matmuls through an emulated GEMM.

    ``type_or_gemm`` is a type name for `gemm_from_type` (then ``dsa``, default
    ``DSA("toy")``, is the device and is kept as ``mode.dsa``), an object with a
    ``.gemm(A, B, dsa)`` method (an `EmulatedType`), or a plain ``gemm(A, B)`` callable.

    >>> with emulated_matmul(my_gemm) as mode:  # doctest: +SKIP
    ...     loss = model(x).square().mean()
    >>> loss.backward()          # backward products are emulated too
    """
    if isinstance(type_or_gemm, str):
        if dsa is None:
            from furnace.emulation.dsa import DSA

            dsa = DSA("toy")
        return EmulatedMatmulMode(gemm_from_type(type_or_gemm, dsa), strict=strict, dsa=dsa)
    method = getattr(type_or_gemm, "gemm", None)
    if callable(method):
        if dsa is None:
            from furnace.emulation.dsa import DSA

            dsa = DSA("toy")
        return EmulatedMatmulMode(_type_gemm(type_or_gemm, dsa), strict=strict, dsa=dsa)
    if dsa is not None:
        raise ValueError(
            "dsa is only used with a type name or an EmulatedType; a gemm "
            "callable carries its own device"
        )
    return EmulatedMatmulMode(type_or_gemm, strict=strict)
