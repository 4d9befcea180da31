"""Read the plan of a model on which the user already called ``fully_shard``.

People check their real training script's wrapping by applying it to a
meta-device model (with the fake process group) and passing that model in.
fsdpviz reads FSDP2's own state (groups, their modules and parameters, the dim
each parameter is sharded on, ``reshard_after_forward`` as the post-forward mesh,
``MixedPrecisionPolicy``, explicit prefetch targets, ``set_unshard_in_backward``, mesh
size) and makes an unsharded meta copy to trace: parameters become meta tensors of their
global shape, FSDP2's hooks and class swap are dropped. The user's model is not modified.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState, _get_module_fsdp_state

from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp2 import finalize_groups
from fsdpviz.plan.fsdp2_group import Group, reshard_map
from fsdpviz.plan.fsdp2_options import FSDP2Options
from fsdpviz.plan.job import parse_job_options
from fsdpviz.plan.tensor_parallel import plan_from_hooks, tp_hooks
from fsdpviz.plan.torch_fsdp import installed
from fsdpviz.schema.mesh import ParallelDims
from fsdpviz.schema.names import group_names


def fsdp2_states(model: nn.Module) -> list[Any]:
    """FSDP2 states in the root's ``named_modules`` order (FSDP2's own state order)."""
    states: list[Any] = []
    for module in model.modules():
        state = _get_module_fsdp_state(module)
        if state is not None and state not in states:
            states.append(state)
    return states


class _Detached:
    """Stands in for an FSDP2 state inside the copy, so its hooks can be found and dropped."""


def _unsharded_copy(model: nn.Module, states: list[Any]) -> tuple[nn.Module, dict[int, Any]]:
    detached = _Detached()
    memo: dict[int, Any] = {id(state): detached for state in states}
    for p in model.parameters():
        memo.setdefault(
            id(p),
            nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), p.requires_grad),
        )
    for b in model.buffers():
        memo.setdefault(id(b), torch.empty(b.shape, dtype=b.dtype, device="meta"))
    originals = {id(p): p for p in model.parameters()}
    # FSDPModule forbids deepcopy: copy with the original classes, restored at once.
    swapped: list[tuple[nn.Module, type]] = [
        (m, type(m)) for m in model.modules() if isinstance(m, FSDPModule)
    ]
    try:
        for wrapped, cls in swapped:
            wrapped.__class__ = unwrapped_class(cls)
        dup = copy.deepcopy(model, memo)
    finally:
        for wrapped, cls in swapped:
            wrapped.__class__ = cls
    for module in dup.modules():
        found = tp_hooks(module)  # parallelize_module's: read from the original model
        for hooks, key in found.keys if found else ():
            hooks.pop(key, None)
            module._forward_pre_hooks_with_kwargs.pop(key, None)
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key, fn in list(hooks.items()):
                owners = [getattr(f, "__self__", None) for f in _wrapping_chain(fn)]
                if any(o is detached or _is_fsdp_state(o) for o in owners):
                    del hooks[key]
                    module._forward_pre_hooks_with_kwargs.pop(key, None)
                    module._forward_hooks_with_kwargs.pop(key, None)
                    module._forward_hooks_always_called.pop(key, None)
    return dup, {i: memo[i] for i in originals}


def _wrapping_chain(fn: Any) -> list[Any]:
    """``fn`` and every function it wraps (``__wrapped__``): a grouped ``fully_shard`` call
    registers its state's hooks under two wrappers (``functools.wraps``, dynamo's disable)."""
    chain: list[Any] = []
    while fn is not None and len(chain) < 8:
        chain.append(fn)
        fn = getattr(fn, "__wrapped__", None)
    return chain


def unwrapped_class(cls: type) -> type:
    """The class ``fully_shard`` made ``FSDP<name>`` from (``cls`` itself if not FSDP's)."""
    if not issubclass(cls, FSDPModule):
        return cls
    return next(c for c in cls.__mro__[1:] if c is not FSDPModule and issubclass(c, nn.Module))


def _is_fsdp_state(obj: Any) -> bool:
    return isinstance(obj, FSDPState)


def _auto_reshard(state: Any) -> bool:
    """Whether the state's ``reshard_after_forward`` is torch's default."""
    return bool(state._auto_reshard_after_forward)


def _reshard_after_forward(state: Any, group: Any, is_root: bool) -> bool | int | None:
    if is_root and _auto_reshard(state):
        return None  # the installed torch's default for the root
    post = group.post_forward_mesh_info
    if post is None:
        return False
    if post == group.mesh_info:
        return True
    return int(post.shard_mesh_size)


def plan_from_fully_sharded(
    model: nn.Module, fsdpviz_kwargs: dict[str, Any]
) -> tuple[nn.Module, list[Group], FSDP2Options]:
    """The unsharded meta copy, its groups and the options read from FSDP2's state."""
    states = fsdp2_states(model)
    dup, mapping = _unsharded_copy(model, states)
    names = {m: n for n, m in model.named_modules()}
    dup_modules = dict(dup.named_modules())
    policies = {repr(s._mp_policy) for s in states}
    if len(policies) > 1:
        raise ConfigError(
            "the fully_shard calls use different MixedPrecisionPolicy objects; fsdpviz models one "
            "policy for the whole model so far"
        )
    infos = [s._fsdp_param_group.mesh_info for s in states if s._fsdp_param_group is not None]
    sizes = {int(i.shard_mesh_size) for i in infos}
    replicas = {int(getattr(i, "replicate_mesh_size", 1)) for i in infos}
    # HSDPMeshInfo (a 2-D mesh) has a replicate dimension whatever its size
    hsdp = any(hasattr(i, "replicate_mesh_size") for i in infos)
    if len(sizes) > 1 or len(replicas) > 1:
        raise ConfigError("the fully_shard calls use meshes of different sizes; not modelled yet")
    offloads = {
        type(s._fsdp_param_group.offload_policy).__name__ == "CPUOffloadPolicy"
        for s in states
        if s._fsdp_param_group is not None
    }
    if len(offloads) > 1:
        raise ConfigError(
            "some fully_shard calls offload to the CPU and some do not; fsdpviz models one "
            "offload_policy for the whole model so far"
        )
    for state in states:
        _check_modelled(state, ", ".join(n for m, n in names.items() if m in set(state._modules)))
    state_name: dict[int, str] = {}
    groups: list[Group] = []
    calls = [tuple(n for m, n in names.items() if m in set(s._modules)) for s in states]
    for state, fqns, name in zip(states, calls, group_names(calls), strict=True):
        state_name[id(state)] = fqns[0]
        group = Group(name=name, modules=tuple(dup_modules[f] for f in fqns), fqns=fqns)
        pg = state._fsdp_param_group
        raf: bool | int | None = None
        if pg is not None:
            group.params = [mapping[id(fp.sharded_param)] for fp in pg.fsdp_params]
            dims = [int(fp.fsdp_placement.dim) for fp in pg.fsdp_params]
            group.shard_dims = dims if any(dims) else []  # its shard_placement_fn's
            raf = _reshard_after_forward(state, pg, fqns == ("",))
        elif not (group.is_root and _auto_reshard(state)):
            raf = True  # a group without parameters: fully_shard's default, never applied
        group.reshard_as(raf)
        groups.append(group)

    def prefetch(attr: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for state in states:
            targets = getattr(state, attr) or []
            if targets:
                out[state_name[id(state)]] = [state_name[id(t)] for t in targets]
        return out

    # set_unshard_in_backward(False): the groups whose pre-backward does not all-gather
    unshard = {
        state_name[id(s)]: False
        for s in states
        if s._fsdp_param_group is not None and not s._fsdp_param_group.unshard_in_backward
    }
    ranks = ParallelDims.product(
        dp_replicate=replicas.pop() if replicas else 1,
        dp_shard=sizes.pop() if sizes else 1,
        hsdp=hsdp,
    )
    opts = FSDP2Options(
        parallel_dims=ranks,
        mesh_names=_hsdp_names(infos[0]) if hsdp else None,
        offload=bool(offloads and offloads.pop()),
        targets=[g.fqns for g in groups],
        reshard_after_forward=reshard_map(groups),
        mp_policy=states[0]._mp_policy if states else MixedPrecisionPolicy(),
        forward_prefetch=prefetch("_states_to_forward_prefetch"),
        backward_prefetch=prefetch("_states_to_backward_prefetch"),
        ignored_params=None,
        loss=fsdpviz_kwargs.get("loss"),
        trace="meta",
        progress=fsdpviz_kwargs.get("progress"),
        job=parse_job_options(fsdpviz_kwargs, "FSDP2"),
        torch=installed(),  # the model's FSDP2 is the installed torch's
        unshard_in_backward=unshard or True,
    )
    tp = _tp_mesh(states)
    if tp is not None and hsdp:
        raise ConfigError(
            "fully_shard on a 2-D (HSDP) mesh of DTensor parameters is not read from an "
            "applied model yet; pass the model before fully_shard and parallelize_module, "
            "with fully_shard=[...], parallelize_plan= and mesh="
        )
    if tp is not None:  # the mesh's ranks: FSDP's 1-D mesh and the tp mesh
        (*_, tp_name), (*_, tp_size) = tp
        opts = opts.replace(
            parallel_dims=dataclasses.replace(ranks, world_size=math.prod(tp[1]), tp=tp_size),
            tp_name=tp_name,
            mesh=dict(zip(*tp, strict=True)),
            tp=plan_from_hooks(model, tp_size, tp_name),
        )
    finalize_groups(dup, groups, opts)
    return dup, groups, opts


def _hsdp_names(info: Any) -> tuple[str, str]:
    """The replicate and shard dimensions' names of an HSDP mesh (``init_device_mesh``'s
    ``mesh_dim_names``; fsdpviz's ``("replicate", "shard")`` where it has none)."""
    names = info.mesh.mesh_dim_names
    if not names:
        return ("replicate", "shard")
    return (str(names[info.replicate_mesh_dim]), str(names[info.shard_mesh_dim]))


# FSDPParamGroup's settings that change what FSDP2 does and that fsdpviz does not model:
# attribute -> (its default, the FSDPModule setter that changes it, what FSDP2 does then)
_UNMODELLED: dict[str, tuple[Any, str, str]] = {
    "reduce_scatter_unused_params": (
        False, "set_reduce_scatter_unused_params(True)",
        "reduce-scatters zeros for its parameters no gradient reached",
    ),
    "reduce_scatter_max_input_buffers": (
        1, "set_reduce_scatter_max_input_buffers(n)",
        "keeps more than one reduce-scatter input buffer in flight",
    ),
    "reduce_grads": (
        True, "set_requires_gradient_sync(False)",
        "does not reduce its gradients (pass grad_accum=N for accumulation instead)",
    ),
    "all_reduce_grads": (
        True, "set_requires_all_reduce(False)",
        "does not all-reduce its gradients (pass grad_accum=N and requires_all_reduce=False "
        "for accumulation instead)",
    ),
    "reshard_after_backward": (
        True, "set_reshard_after_backward(False)",
        "keeps its parameters gathered after backward (pass grad_accum=N and "
        "reshard_after_backward=False for accumulation instead)",
    ),
}  # fmt: skip


def _check_modelled(state: Any, name: str) -> None:
    """Refuse a group whose FSDP2 settings fsdpviz does not model, with what to change."""
    pg = state._fsdp_param_group
    for attr, (default, setter, does) in _UNMODELLED.items():
        value = getattr(pg, attr, default) if pg is not None else default
        if value != default:
            raise ConfigError(
                f"the fully_shard group {name or '(root)'!r} has {setter} (FSDP2 then {does}), "
                f"which fsdpviz does not model; undo it ({attr}={default!r}) before analyze, "
                "or pass the model before fully_shard with fully_shard=[...]"
            )


def _tp_mesh(states: list[Any]) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """The names and sizes of FSDP's mesh and the tp mesh (tp last) where FSDP2 manages
    DTensor parameters (``parallelize_module`` before ``fully_shard``), None if it does not."""
    for state in states:
        pg = state._fsdp_param_group
        for fp in pg.fsdp_params if pg is not None else ():
            if fp.is_dtensor:
                spec = getattr(fp, "_unsharded_dtensor_spec", None) or fp._tp_spec
                dp, tp = pg.mesh_info.mesh, spec.mesh
                names = (*(dp.mesh_dim_names or ("dp_shard",)), *(tp.mesh_dim_names or ("tp",)))
                return tuple(str(n) for n in names), (*map(int, dp.shape), *map(int, tp.shape))
    return None
