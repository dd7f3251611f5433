"""Sharding a job's model over its ranks (``resources.strategy: fsdp``) with FSDP2's ``fully_shard``.

Each *unit* is sharded on its own and gathered only around its own forward and backward, then the
root takes what is left (as torchtitan's parallelize functions do). The units are:

- what the model's ``shard_units()`` returns (a list of its submodules), when it has that method;
- else its children that hold parameters, a container's (``ModuleList``, ``ModuleDict``,
  ``Sequential``: a stack of blocks) own children standing for it (a ``ModuleList`` has no forward
  to gather around, and a stack gathered whole would hold every block's parameters at once).

A parameter that two units share (tied weights: a language model's head and its token embedding)
leaves both of them to the root, so that it is gathered once. bf16 goes through FSDP's own
mixed-precision policy (parameters gathered in bf16, gradients reduced in fp32), not autocast.

The optimizer is built on the sharded parameters (``build_components`` calls ``shard_model``
between the model and the optimizer), so its state is sharded too.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from baton.schemas.errors import PermanentError


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one before the root (see the module's docstring)."""
    named = getattr(model, "shard_units", None)
    if callable(named):
        units = list(named())
        owned = {id(module) for module in model.modules()}
        for unit in units:
            if not isinstance(unit, nn.Module) or id(unit) not in owned or unit is model:
                raise PermanentError(f"{type(model).__name__}.shard_units() must return submodules of the model "
                                     f"(got {type(unit).__name__})")
        chosen = {id(unit) for unit in units}
        for unit in units:
            inner = next((m for m in unit.modules() if m is not unit and id(m) in chosen), None)
            if inner is not None:
                raise PermanentError(f"{type(model).__name__}.shard_units(): {type(inner).__name__} is inside "
                                     f"{type(unit).__name__}, another unit; units may not nest")
    else:
        units = []
        for child in model.children():
            if isinstance(child, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
                units.extend(grand for grand in child.children() if _has_parameters(grand))
            elif _has_parameters(child):
                units.append(child)
    return _without_shared(units)


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _without_shared(units: list[nn.Module]) -> list[nn.Module]:
    """``units`` less those holding a parameter another unit holds too (the root takes them)."""
    holders: dict[int, int] = {}
    for unit in units:
        for param in unit.parameters():
            holders[id(param)] = holders.get(id(param), 0) + 1
    return [unit for unit in units if all(holders[id(param)] == 1 for param in unit.parameters())]


def mixed_precision(precision: str, root: bool = False) -> MixedPrecisionPolicy:
    """bf16: parameters gathered in bf16 for compute, gradients reduced in fp32, and the root's
    output cast back to fp32 (the loss is computed in fp32, as autocast would for a loss); else fp32
    throughout."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                    output_dtype=torch.float32 if root else None)
    return MixedPrecisionPolicy()


def shard_model(model: nn.Module, mesh: DeviceMesh, precision: str) -> nn.Module:
    """Shard ``model`` in place over ``mesh``: each unit, then the root. Returns it."""
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, mp_policy=mixed_precision(precision))
    fully_shard(model, mesh=mesh, mp_policy=mixed_precision(precision, root=True))
    return model
