"""Resharding checkpoints for MoDa (BaGuaLu, Ma et al., PPoPP'22; issue 13, item 5) with
``torch.distributed.checkpoint`` (DCP): save under one layout (world size W, expert-parallel
size P), load under another, optimizer state included.

What follows the paper: nothing beyond the need (BaGuaLu's code and checkpoint format are
not public). Everything here is our design, on DCP, the format PyTorch users already have.

Format. A checkpoint is a directory::

    <path>/.metadata              DCP's index: every key's global shape, dtype and chunks
    <path>/__<rank>_0.distcp      DCP's data, one file per saving rank (W files)
    <path>/furnace_checkpoint.pt  our record, written by rank 0 (plain data, weights_only):
                                  format tag and version, the caller's metadata (with
                                  "layout"), the optimizer's param groups by parameter name,
                                  which optimizer state keys each parameter has, and its
                                  non-tensor state values

DCP keys are ``model.<parameter name>`` and ``optim.<parameter name>.<state key>``
(``exp_avg``, ``exp_avg_sq``, ``step`` for AdamW): the optimizer's index-keyed state is
re-keyed by parameter name, which is what makes it independent of the layout.

Resharding. Each expert parameter's local shard (expert dimension first; rank r holds shard
r % P, EP groups are runs of consecutive ranks, see `furnace.hybrid.layout`) is saved as a
DTensor with placements ``[Replicate(), Shard(0)]`` on a 2-D DeviceMesh ("edp", "ep") of
shape (W/P, P) whose rank ``edp_index * P + ep_index`` is the MoDa rank, built from MoDa's
own process groups (`DeviceMesh.from_group`: no new groups, no collective). DCP then stores
each expert tensor as ONE global ``[num_experts, ...]`` tensor (the W/P replicas of a shard
deduplicated), and replicated parameters as plain tensors (deduplicated across ranks).
Loading under another layout builds DTensor templates of the new layout and lets DCP read
the overlapping chunks; a plain single-process model reads the same keys as full tensors
(`save_module_checkpoint` / `load_module_checkpoint`), so checkpoints move freely between
one process and any MoDa layout. Exp_avg and exp_avg_sq of an expert are sharded like the
expert (they have its shape); scalar state (``step``) is replicated.

Safety. A save writes into a sibling temporary directory and rank 0 renames it onto
``path`` only once DCP has finished on every rank and the record is written: a crash
mid-save leaves the previous checkpoint (or nothing) under ``path``, never half of one.
(A crash between rank 0's two renames leaves the previous checkpoint as
``.<name>.replaced`` beside ``path``.) A load checks the checkpoint against the model
before reading any tensor: other parameter names, shapes, dtypes or expert counts raise
`CheckpointMismatchError`, a missing path `CheckpointNotFoundError`, anything unreadable
`CorruptCheckpointError`; every rank reads the same files, so every rank raises the same
error and no collective is left waiting. Loaded values go to fresh buffers first and are
copied into the parameters only after DCP succeeded.

Limits: expert banks must be stacked (`furnace.moe.MLPExperts`: every parameter has the
expert dimension first); buffers are saved as replicated; checkpoint directories must be on
a filesystem every rank sees.
"""

from __future__ import annotations

import contextlib
import copy
import io
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from furnace.moe import MoELayer
from furnace.runtime.training import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
)

from .moda import MoDa

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "RECORD_FILE",
    "load_moda_checkpoint",
    "load_module_checkpoint",
    "read_moda_metadata",
    "save_moda_checkpoint",
    "save_module_checkpoint",
]

CHECKPOINT_FORMAT = "furnace-hybrid-dcp"
CHECKPOINT_VERSION = 1
RECORD_FILE = "furnace_checkpoint.pt"
DESCRIPTION = "a furnace hybrid (MoDa) DCP checkpoint"
MESH_DIMS = ("edp", "ep")


@dataclass(frozen=True)
class _Entry:
    """One tensor of this rank's state: its DCP key and how it lies across ranks.

    ``global_shape`` is the shape of the tensor in the checkpoint; ``sharded`` is True for
    an expert tensor whose local value is shard ``ep_index`` of it along dimension 0.
    """

    key: str
    global_shape: tuple[int, ...]
    dtype: torch.dtype
    sharded: bool


@dataclass(frozen=True)
class _Layout:
    """The layout a process saves or loads under, and its mesh (None: one process)."""

    world_size: int
    expert_parallel_size: int
    rank: int
    mesh: DeviceMesh | None
    group: dist.ProcessGroup | None
    no_dist: bool


# ---------------------------------------------------------------------------------------
# public API


def save_moda_checkpoint(path: str | Path, moda: MoDa, optimizer: torch.optim.Optimizer, *,
                         metadata: dict[str, Any]) -> None:
    """Save ``moda``'s model and ``optimizer`` to the directory ``path`` (collective over
    ``moda.groups.world``: every rank calls it).

    ``metadata`` (rank 0's is written) is plain data and tensors (what a ``weights_only``
    load reads: numbers, strings, lists, tuples, dicts, tensors such as generator states);
    the layout ``{"world_size", "expert_parallel_size", "num_experts", "experts_per_layer"}``
    is added under ``"layout"``. An existing checkpoint under ``path`` is replaced only once
    the new one is complete; an existing directory that is not a checkpoint is refused.
    """
    _save(Path(path), moda.model, optimizer, metadata, _moda_layout(moda))


def save_module_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                           *, metadata: dict[str, Any]) -> None:
    """`save_moda_checkpoint` for a plain, unsharded model in one process (layout W = P = 1),
    in the same format; no process group is used even if one is initialized."""
    _check_unsharded(model)
    _save(Path(path), model, optimizer, metadata, _single_layout())


def read_moda_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata dict saved with the checkpoint at ``path`` (with ``"layout"``); needs
    no process group and no model.

    Raises:
        CheckpointNotFoundError: ``path`` does not exist.
        CorruptCheckpointError: ``path`` is not a readable checkpoint of this format.
    """
    metadata: dict[str, Any] = copy.deepcopy(_read_record(Path(path))["metadata"])
    return metadata


def load_moda_checkpoint(path: str | Path, moda: MoDa,
                         optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Fill this rank's parameters (its expert shard under its CURRENT layout, which may
    differ from the saved one) and ``optimizer``'s state from ``path``; return the
    metadata. Collective over ``moda.groups.world``.

    Raises:
        CheckpointNotFoundError, CorruptCheckpointError: as `read_moda_metadata`.
        CheckpointMismatchError: the checkpoint holds another model (other parameter
            names, shapes, dtypes or expert counts) or an optimizer over other parameters.
    """
    return _load(Path(path), moda.model, optimizer, _moda_layout(moda))


def load_module_checkpoint(path: str | Path, model: nn.Module,
                           optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`load_moda_checkpoint` into a plain, unsharded model in one process (any saved
    layout: the experts are read as full tensors)."""
    _check_unsharded(model)
    return _load(Path(path), model, optimizer, _single_layout())


# ---------------------------------------------------------------------------------------
# layouts and the state's entries


def _group_of(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    world = dist.group.WORLD
    assert world is not None
    return group if group is not None else world


def _moda_layout(moda: MoDa) -> _Layout:
    layout = moda.groups.layout
    W, P = layout.world_size, layout.expert_parallel_size
    # rank = edp_index * P + ep_index: row k of the mesh is EP group k, column i the EDP
    # group of shard i (MoDaLayout's numbering); the groups are MoDa's own
    mesh = DeviceMesh.from_group(
        [_group_of(moda.groups.edp.group), _group_of(moda.groups.ep.group)], "cpu",
        mesh=torch.arange(W, dtype=torch.int).reshape(W // P, P), mesh_dim_names=MESH_DIMS)
    return _Layout(world_size=W, expert_parallel_size=P, rank=moda.groups.rank, mesh=mesh,
                   group=moda.groups.world.group, no_dist=False)


def _single_layout() -> _Layout:
    return _Layout(world_size=1, expert_parallel_size=1, rank=0, mesh=None, group=None,
                   no_dist=True)


def _moe_layers(model: nn.Module) -> Iterator[tuple[str, MoELayer]]:
    for name, module in model.named_modules():
        if isinstance(module, MoELayer):
            yield name, module


def _check_unsharded(model: nn.Module) -> None:
    for name, layer in _moe_layers(model):
        if layer.experts.num_experts != layer.num_experts or layer.parallel is not None:
            raise ValueError(f"layer {name!r} is expert-parallel: use the moda functions "
                             "for a sharded model")


def _experts_per_layer(model: nn.Module) -> dict[str, int]:
    return {name: layer.num_experts for name, layer in _moe_layers(model)}


def _expert_params(model: nn.Module) -> dict[str, int]:
    """Name of every expert parameter -> its layer's global expert count (stacked banks)."""
    out: dict[str, int] = {}
    for prefix, layer in _moe_layers(model):
        bank = layer.experts
        for name, p in bank.named_parameters():
            if p.dim() == 0 or p.shape[0] != bank.num_experts:
                raise ValueError(
                    f"{prefix}.experts.{name} has shape {tuple(p.shape)}, not the expert "
                    f"dimension ({bank.num_experts}) first: only stacked expert banks "
                    "(furnace.moe.MLPExperts) can be resharded")
            out[f"{prefix}.experts.{name}" if prefix else f"experts.{name}"] = layer.num_experts
    return out


def _model_entries(model: nn.Module) -> dict[str, tuple[torch.Tensor, _Entry]]:
    """Parameter / buffer name -> (local tensor, entry); experts with their global shape."""
    experts = _expert_params(model)
    out: dict[str, tuple[torch.Tensor, _Entry]] = {}
    for name, p in model.named_parameters():
        if name in experts:
            shape = (experts[name], *p.shape[1:])
            out[name] = (p, _Entry(f"model.{name}", shape, p.dtype, sharded=True))
        else:
            out[name] = (p, _Entry(f"model.{name}", tuple(p.shape), p.dtype, sharded=False))
    for name, b in model.named_buffers():
        if any(name.startswith(e.rsplit(".", 1)[0] + ".") for e in experts):
            raise ValueError(f"buffer {name} lives in an expert bank: expert buffers "
                             "cannot be resharded")
        out[name] = (b, _Entry(f"model.{name}", tuple(b.shape), b.dtype, sharded=False))
    return out


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _wrap(local: torch.Tensor, entry: _Entry, layout: _Layout) -> torch.Tensor:
    """The value DCP sees: a DTensor for an expert shard, the tensor itself otherwise."""
    if not entry.sharded or layout.mesh is None:
        return local
    stride = torch.empty(entry.global_shape, device="meta").stride()
    return DTensor.from_local(local, layout.mesh, [Replicate(), Shard(0)], run_check=False,
                              shape=torch.Size(entry.global_shape), stride=stride)


def _state_entry(name: str, key: str, value: torch.Tensor, param: _Entry,
                 param_shape: tuple[int, ...]) -> _Entry:
    """An optimizer state tensor is sharded like its parameter when it has its shape."""
    sharded = param.sharded and tuple(value.shape) == param_shape
    shape = param.global_shape if sharded else tuple(value.shape)
    return _Entry(f"optim.{name}.{key}", shape, value.dtype, sharded)


# ---------------------------------------------------------------------------------------
# save


def _check_plain(metadata: dict[str, Any]) -> None:
    """Refuse metadata that a weights_only load could not read back (before any collective)."""
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    buffer = io.BytesIO()
    torch.save(metadata, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as exc:
        raise ValueError("metadata must be plain data and tensors (a weights_only load "
                         f"cannot read it back: {exc})") from exc


def _save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
          metadata: dict[str, Any], layout: _Layout) -> None:
    _check_plain(metadata)
    if path.exists() and not (path.is_dir() and ((path / RECORD_FILE).is_file()
                                                 or not any(path.iterdir()))):
        # never delete what is not ours
        raise CheckpointError(path, "exists and is not a furnace hybrid checkpoint; "
                              "refusing to replace it")
    entries = _model_entries(model)
    state: dict[str, Any] = {}
    for local, entry in entries.values():
        state[entry.key] = _wrap(local.detach(), entry, layout)
    names = _param_names(model)
    groups_record = []
    state_keys: dict[str, list[str]] = {}
    extra: dict[str, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        hyper = {k: v for k, v in group.items() if k != "params"}
        group_names = []
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError("the optimizer holds a tensor that is not a parameter "
                                 "of the model")
            group_names.append(names[id(p)])
        groups_record.append({"hyper": hyper, "names": group_names})
        for p in group["params"]:
            name = names[id(p)]
            param = entries[name][1]
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    entry = _state_entry(name, key, value, param, tuple(p.shape))
                    state[entry.key] = _wrap(value.detach(), entry, layout)
                    state_keys.setdefault(name, []).append(key)
                else:
                    extra.setdefault(name, {})[key] = value
    experts_per_layer = _experts_per_layer(model)
    counts = set(experts_per_layer.values())
    record = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "metadata": dict(metadata, layout={
            "world_size": layout.world_size,
            "expert_parallel_size": layout.expert_parallel_size,
            "num_experts": counts.pop() if len(counts) == 1 else None,
            "experts_per_layer": experts_per_layer,
        }),
        "optimizer": {"param_groups": groups_record, "state_keys": state_keys,
                      "extra": extra},
    }
    partial = path.parent / f".{path.name}.partial"
    replaced = path.parent / f".{path.name}.replaced"
    if layout.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier(layout)
    with _quiet_single_process(layout):
        dcp.save(state, checkpoint_id=partial, process_group=layout.group,
                 no_dist=layout.no_dist)
    error = None
    if layout.rank == 0:
        try:
            torch.save(record, partial / RECORD_FILE)
            if path.exists():
                shutil.rmtree(replaced, ignore_errors=True)
                path.rename(replaced)
            partial.rename(path)
            shutil.rmtree(replaced, ignore_errors=True)
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
    # rank 0's outcome reaches every rank, so a failed rename raises everywhere, not a hang
    if not layout.no_dist:
        box = [error]
        dist.broadcast_object_list(box, src=0, group=layout.group)
        error = box[0]
    if error is not None:
        raise CheckpointError(path, f"could not be written: {error}")


@contextlib.contextmanager
def _quiet_single_process(layout: _Layout) -> Iterator[None]:
    """Silence DCP's warning that it runs in one process: here that is what was asked."""
    with warnings.catch_warnings():
        if layout.no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier(layout: _Layout) -> None:
    if not layout.no_dist:
        dist.barrier(group=layout.group)


# ---------------------------------------------------------------------------------------
# load


def _read_record(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointNotFoundError(path, "does not exist")
    if not path.is_dir():
        raise CorruptCheckpointError(path, f"is not a directory ({DESCRIPTION} is one)")
    record_file = path / RECORD_FILE
    if not record_file.is_file():
        raise CorruptCheckpointError(path, f"is not {DESCRIPTION} (no {RECORD_FILE})")
    try:
        record = torch.load(record_file, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, ...
        raise CorruptCheckpointError(path, f"has an unreadable {RECORD_FILE} (truncated "
                                     f"or corrupt: {type(exc).__name__})") from exc
    if not isinstance(record, dict) or record.get("format") != CHECKPOINT_FORMAT:
        raise CorruptCheckpointError(path, f"is not {DESCRIPTION} (no format tag "
                                     f"{CHECKPOINT_FORMAT!r})")
    if record.get("version") != CHECKPOINT_VERSION:
        raise CorruptCheckpointError(path, f"has version {record.get('version')!r}; this "
                                     f"furnace reads version {CHECKPOINT_VERSION}")
    valid = (isinstance(record.get("metadata"), dict)
             and isinstance(record["metadata"].get("layout"), dict)
             and isinstance(record.get("optimizer"), dict))
    if not valid:
        raise CorruptCheckpointError(path, "has an incomplete record")
    return record


def _read_index(path: Path) -> Metadata:
    try:
        index = dcp.FileSystemReader(path).read_metadata()
    except Exception as exc:
        raise CorruptCheckpointError(path, f"has no readable DCP index (.metadata: "
                                     f"{type(exc).__name__})") from exc
    return index


def _stored(index: Metadata, entry: _Entry) -> tuple[Any, Any] | None:
    """(stored shape, stored dtype) of ``entry.key``, or None when they match."""
    meta = index.state_dict_metadata.get(entry.key)
    if not isinstance(meta, TensorStorageMetadata):
        return ("absent", None)
    if tuple(meta.size) != entry.global_shape or meta.properties.dtype != entry.dtype:
        return (tuple(meta.size), meta.properties.dtype)
    return None


def _load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
          layout: _Layout) -> dict[str, Any]:
    record = _read_record(path)
    index = _read_index(path)
    differences: list[tuple[str, Any, Any]] = []
    saved_layout = record["metadata"]["layout"]
    saved_counts = saved_layout.get("experts_per_layer")
    counts = _experts_per_layer(model)
    if saved_counts != counts:
        differences.append(("experts_per_layer", saved_counts, counts))
    entries = _model_entries(model)
    for _, entry in entries.values():
        stored = _stored(index, entry)
        if stored is not None:
            differences.append((entry.key, stored[0], (entry.global_shape, entry.dtype)))
    ours = {entry.key for _, entry in entries.values()}
    for key in index.state_dict_metadata:
        if key.startswith("model.") and key not in ours:
            differences.append((key, "saved", "absent from the model"))
    # the optimizer: the same parameters in the same groups, by name
    names = _param_names(model)
    saved_groups = record["optimizer"]["param_groups"]
    current = [[names.get(id(p), "?") for p in g["params"]] for g in optimizer.param_groups]
    saved_names = [list(g["names"]) for g in saved_groups]
    if [sorted(g) for g in saved_names] != [sorted(g) for g in current]:
        differences.append(("optimizer parameter groups", saved_names, current))
    if differences:
        raise CheckpointMismatchError(path, differences,
                                      "the model must have the checkpoint's parameters")

    state_keys: dict[str, list[str]] = record["optimizer"]["state_keys"]
    request: dict[str, Any] = {}
    fresh: dict[str, torch.Tensor] = {}

    def ask(entry: _Entry, local_shape: tuple[int, ...]) -> None:
        local = torch.empty(local_shape, dtype=entry.dtype)
        fresh[entry.key] = local
        request[entry.key] = _wrap(local, entry, layout)

    for local, entry in entries.values():
        ask(entry, tuple(local.shape))
    by_name = dict(model.named_parameters())
    for name, keys in state_keys.items():
        param = entries[name][1]
        for key in keys:
            meta = index.state_dict_metadata.get(f"optim.{name}.{key}")
            if not isinstance(meta, TensorStorageMetadata):
                raise CorruptCheckpointError(path, f"lacks optimizer state optim.{name}.{key}")
            shape = tuple(meta.size)
            sharded = param.sharded and shape == param.global_shape
            entry = _Entry(f"optim.{name}.{key}", shape, meta.properties.dtype, sharded)
            ask(entry, tuple(by_name[name].shape) if sharded else shape)
    try:
        with _quiet_single_process(layout):
            dcp.load(request, checkpoint_id=path, process_group=layout.group,
                     no_dist=layout.no_dist)
    except Exception as exc:
        raise CorruptCheckpointError(path, f"could not be read by DCP "
                                     f"({type(exc).__name__}: {exc})") from exc

    with torch.no_grad():
        for local, entry in entries.values():
            local.copy_(fresh[entry.key])
    # the optimizer's own state_dict (index-keyed) rebuilt from names, so that torch's
    # load_state_dict checks the groups and casts as it always does
    index_of = {name: i for i, name in
                enumerate(n for group in current for n in group)}
    extra: dict[str, dict[str, Any]] = record["optimizer"]["extra"]
    opt_state: dict[int, dict[str, Any]] = {}
    for name in index_of:
        values: dict[str, Any] = {key: fresh[f"optim.{name}.{key}"]
                                  for key in state_keys.get(name, [])}
        values.update(extra.get(name, {}))
        if values:
            opt_state[index_of[name]] = values
    groups_by_names = {tuple(sorted(g["names"])): g["hyper"] for g in saved_groups}
    param_groups = [dict(groups_by_names[tuple(sorted(group))],
                         params=[index_of[n] for n in group]) for group in current]
    optimizer.load_state_dict({"state": opt_state, "param_groups": param_groups})
    metadata: dict[str, Any] = record["metadata"]
    return metadata
