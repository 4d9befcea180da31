"""Per-module facts of a report (``ModuleInfo``), shared by the FSDP1 and FSDP2 paths."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from fsdpviz.schema.report import IgnoredParam, ModuleInfo, dtype_name
from fsdpviz.trace.tracker import ModuleCalls


@dataclass(frozen=True)
class ParamPlacement:
    """Where one parameter name lives: its unit, shape, element size, primary name."""

    fqn: str
    unit: str
    shape: list[int]
    itemsize: int
    primary: str


def module_infos(
    model: nn.Module,
    placements: list[ParamPlacement],
    unit_of_module: dict[str, str],
    records: dict[str, ModuleCalls],
    named: list[tuple[str, nn.Module]] | None = None,
) -> list[ModuleInfo]:
    """One ``ModuleInfo`` per module of ``model`` (fsdpviz's copy, before planning);
    ``named``: ``list(model.named_modules())`` when the caller keeps it."""
    direct: dict[str, dict[str, list[int]]] = {}
    managed_by: dict[str, str] = {}
    itemsize: dict[str, int] = {}
    for p in placements:
        owner, _, name = p.fqn.rpartition(".")
        direct.setdefault(owner, {})[name] = p.shape
        managed_by.setdefault(owner, p.unit)
        itemsize[p.unit] = p.itemsize
    infos: list[ModuleInfo] = []
    for fqn, module in model.named_modules() if named is None else named:
        params = direct.get(fqn, {})
        numel = sum(math.prod(s) for s in params.values())
        unit = managed_by.get(fqn, unit_of_module.get(fqn))
        rec = records.get(fqn)
        infos.append(
            ModuleInfo(
                fqn=fqn,
                module_class=type(module).__name__,
                parent=None if not fqn else fqn.rpartition(".")[0],
                unit=unit,
                numel=numel,
                bytes=numel * itemsize.get(unit or "", 0),
                params=params,
                calls=rec.calls if rec else 0,
                input_shapes=rec.input_shapes if rec else [],
                output_shapes=rec.output_shapes if rec else [],
            )
        )
    return infos


def param_first_use(placements: list[ParamPlacement], module_order: list[str]) -> dict[str, str]:
    """The first module, in forward order, that holds each parameter (primary names)."""
    owners: dict[str, list[str]] = {}
    for p in placements:
        owners.setdefault(p.fqn.rpartition(".")[0], []).append(p.primary)
    first: dict[str, str] = {}
    for module in module_order:
        for param in owners.get(module, []):
            first.setdefault(param, module)
    return first


def ignored_param_infos(model: nn.Module, managed: set[int]) -> list[IgnoredParam]:
    """The parameters of ``model`` whose ids are not in ``managed`` (FSDP's units'), each
    once under its first FQN, in ``named_parameters()`` order: what FSDP leaves whole on
    every rank."""
    return [
        IgnoredParam(
            fqn,
            list(p.shape),
            dtype_name(p.dtype) or "float32",
            p.numel() * p.element_size(),
            p.requires_grad,
        )
        for fqn, p in model.named_parameters()
        if id(p) not in managed
    ]
