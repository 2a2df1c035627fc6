"""The offline training tasks of the Prague reproduction (design note `prague.md`
section 7.1, item 7): scikit-learn's handwritten digits, a small CNN (38,282 parameters,
compute-bound) and a wide MLP (about 1.1M parameters at the default, bandwidth-bound),
and the flat-buffer plumbing P-Reduce relies on.

P-Reduce averages one contiguous buffer per worker (like torch's `average_parameters`).
`flat_parameters` and `flat_gradients` make every parameter and gradient a view into such
a buffer, so the optimizer's in-place step, autograd's gradient accumulation and an
in-place average of the buffer all act on the same memory, with no copy in or out.

The data ships inside scikit-learn (no download); scikit-learn is the optional extra
``furnace[decentralized]`` and is imported only when the data is loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import TASKS

__all__ = ["MIN_SKEWED_SHARD", "TASKS", "DigitsCNN", "DigitsMLP", "DigitsSplit", "accuracy",
           "build_model", "flat_gradients", "flat_parameters", "label_skewed_indices",
           "load_digits_split", "load_state_into", "loss_fn", "parameter_vector",
           "sample_batch", "shard"]

# load_digits stores pixel intensities as counts 0..16 (4x4 blocks of a 32x32 bitmap)
_PIXEL_MAX = 16.0


@dataclass(frozen=True)
class DigitsSplit:
    """A seeded train/test split: images (N, 1, 8, 8) float32 in [0, 1], labels int64."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


@lru_cache(maxsize=1)
def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    # every rank and every test loads the same file; parse it once per process
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise ImportError("the digits tasks need scikit-learn: "
                          "pip install 'furnace[decentralized]'") from exc
    data = load_digits()
    images = np.asarray(data.images, dtype=np.float32) / _PIXEL_MAX
    labels = np.asarray(data.target, dtype=np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_digits_split(seed: int = 0, test_size: int = 297) -> DigitsSplit:
    """The 1797 digits, permuted by ``seed``; the first ``test_size`` are held out."""
    images, labels = _raw_digits()
    if not 0 < test_size < len(labels):
        raise ValueError(f"test_size must be in 1..{len(labels) - 1}, got {test_size}")
    order = np.random.default_rng(seed).permutation(len(labels))
    x = torch.from_numpy(images[order].copy()).unsqueeze(1)
    y = torch.from_numpy(labels[order].copy())
    return DigitsSplit(train_x=x[test_size:].clone(), train_y=y[test_size:].clone(),
                       test_x=x[:test_size].clone(), test_y=y[:test_size].clone())


def shard(split: DigitsSplit, rank: int, world_size: int, *,
          label_alpha: float | None = None, seed: int = 0
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank's shard of the training set. Shards are disjoint and together cover it.

    Without ``label_alpha``: iid, every world_size-th image from ``rank`` on (the split is
    already randomly permuted). With it: label-skewed, each class split among the workers
    in proportions drawn from Dirichlet(label_alpha) (Hsu et al., 2019, "Measuring the
    effects of non-identical data distribution"); small alpha gives each worker a few
    classes, large alpha tends to iid. ``seed`` draws the proportions, the same on every
    rank."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
    if label_alpha is None:
        return split.train_x[rank::world_size], split.train_y[rank::world_size]
    mine = label_skewed_indices(split.train_y, world_size, label_alpha, seed)[rank]
    return split.train_x[mine], split.train_y[mine]


# a label-skewed partition is redrawn until every worker holds at least this many
# samples (as FedML's Dirichlet partitioner does), and given up after this many draws
MIN_SKEWED_SHARD = 10
_SKEW_DRAWS = 100


def label_skewed_indices(labels: torch.Tensor, world_size: int, alpha: float,
                         seed: int) -> list[torch.Tensor]:
    """The Dirichlet label partition of `shard`: one sorted index tensor per worker. Each
    class's samples are cut among the workers at cumulative proportions drawn from
    Dirichlet(alpha); the whole draw is repeated (from the same seeded stream) until every
    worker holds at least ``MIN_SKEWED_SHARD`` samples. Raises ValueError when no draw of
    ``_SKEW_DRAWS`` does (alpha too small for this many workers)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"label_alpha must be a finite number > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    for _ in range(_SKEW_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(world_size)]
        for idx in by_class:
            shares = rng.dirichlet([alpha] * world_size)
            cuts = np.round(np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for w, chunk in enumerate(np.split(idx, cuts)):
                parts[w].append(chunk)
        sizes = [sum(len(c) for c in p) for p in parts]
        if min(sizes) >= MIN_SKEWED_SHARD:
            return [torch.from_numpy(np.sort(np.concatenate(p))) for p in parts]
    raise ValueError(f"label_alpha {alpha:g} leaves some of {world_size} workers under "
                     f"{MIN_SKEWED_SHARD} samples in {_SKEW_DRAWS} draws; use a larger alpha")


def sample_batch(x: torch.Tensor, y: torch.Tensor, batch_size: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` samples drawn with replacement, so any shard size supports any batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(x) == 0:
        raise ValueError("cannot sample from an empty shard")
    idx = torch.randint(0, len(x), (batch_size,), generator=generator)
    return x[idx], y[idx]


class DigitsCNN(nn.Module):
    """conv 1->16, conv 16->32 (3x3, pad 1), maxpool 2, linear 512->64->10: 38,282
    parameters, about 4 ms per step on one thread (note section 7.1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        out: torch.Tensor = self.fc2(F.relu(self.fc1(x.flatten(1))))
        return out


class DigitsMLP(nn.Module):
    """64 -> hidden (x depth, ReLU) -> 10 on the flattened image. At the default 1024 x 2
    it has 1,126,410 parameters: enough bytes per synchronization that communication, not
    compute, bounds a step (the "MLP-big" variant of note section 7.1)."""

    def __init__(self, hidden: int = 1024, depth: int = 2) -> None:
        super().__init__()
        if hidden < 1 or depth < 1:
            raise ValueError(f"hidden and depth must be >= 1, got {hidden} and {depth}")
        layers: list[nn.Module] = []
        width = 64
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x.flatten(1))
        return out


def build_model(task: str, seed: int, *, hidden: int = 1024, depth: int = 2) -> nn.Module:
    """The model of ``task`` (one of TASKS) initialised from ``seed``: the same seed gives
    identical weights, and the global RNG is left as it was (ranks seed it themselves)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    # nn init draws from the global generator; fork it so callers' streams are untouched
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if task == "digits_cnn":
            return DigitsCNN()
        return DigitsMLP(hidden=hidden, depth=depth)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy, the loss of every task."""
    return F.cross_entropy(logits, targets)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy of ``model`` on (x, y), in eval mode; the training flag is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            correct = (model(x).argmax(dim=1) == y).sum().item()
    finally:
        model.train(was_training)
    return float(correct) / len(y)


def _float32_parameters(model: nn.Module) -> list[nn.Parameter]:
    params = list(model.parameters())
    if not params:
        raise ValueError("the model has no parameters")
    wrong = {str(p.dtype) for p in params if p.dtype != torch.float32}
    if wrong:
        raise ValueError(f"flat buffers are float32; the model has {sorted(wrong)} parameters")
    return params


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """Move every parameter into one contiguous float32 buffer and return it.

    Values are copied in, then each ``p.data`` becomes a view of its slice, so writing
    the buffer changes the model and an optimizer step on the parameters changes the
    buffer. The Parameter objects stay the same, so an optimizer built before or after
    steps them all the same.
    """
    params = _float32_parameters(model)
    flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32,
                       device=params[0].device)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset:offset + n].copy_(p.reshape(-1))
            p.data = flat[offset:offset + n].view_as(p)
            offset += n
    return flat


def flat_gradients(model: nn.Module) -> torch.Tensor:
    """Give every parameter a zero ``.grad`` that is a view into one flat float32 buffer,
    and return the buffer (laid out as `flat_parameters`'s).

    Autograd accumulates into an existing ``.grad`` in place, so after backward the buffer
    holds the concatenated gradients. Zero it with ``flat_grad.zero_()``: the default
    ``optimizer.zero_grad()`` sets grads to None and would cut the views.
    """
    params = _float32_parameters(model)
    flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32,
                       device=params[0].device)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p)
        offset += n
    return flat


def parameter_vector(model: nn.Module) -> torch.Tensor:
    """A float32 copy of the parameters, concatenated in `flat_parameters`'s order."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def load_state_into(model: nn.Module, flat_values: torch.Tensor) -> None:
    """Copy a concatenated parameter vector (as `parameter_vector` returns) into the model
    in place, whether or not its parameters are views of a flat buffer."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if flat_values.dim() != 1 or flat_values.numel() != total:
        raise ValueError(f"expected a flat vector of {total} values, got shape "
                         f"{tuple(flat_values.shape)}")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat_values[offset:offset + n].view_as(p))
            offset += n
