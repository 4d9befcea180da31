"""Lightning's ``FSDPStrategy`` as the FSDP arguments Lightning passes.

Lightning itself builds the strategy (``lightning.pytorch.strategies.FSDPStrategy``): it turns
a set of layer classes into ``ModuleWrapPolicy``, a strategy name into ``ShardingStrategy``,
``cpu_offload=True`` into ``CPUOffload``, sets ``use_orig_params=True``, and picks
``MixedPrecision`` from the trainer's ``precision`` (``FSDPPrecision``); fsdpviz reads the
result, so a plan follows the installed Lightning exactly. A strategy already built
(``Trainer(strategy=FSDPStrategy(...))``, or a registered name such as ``"fsdp"``) is read
the same way.

Hybrid sharding without a ``device_mesh`` shards as FSDP does without a process group:
within a node (FSDP takes the node's device count, Lightning's ``devices``) and
replicates across the ``num_nodes`` nodes; ``device_mesh=(replicas, shard)`` says otherwise.
"""

from __future__ import annotations

import difflib
import inspect
from typing import TYPE_CHECKING, Any, cast

from torch.distributed.fsdp import FullyShardedDataParallel

from fsdpviz.configs.common import TrainerConfig, note
from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.schema.mesh import HYBRID_STRATEGIES

if TYPE_CHECKING:
    from fsdpviz.api.keywords import AnalyzeKwargs

# FSDPStrategy arguments that configure processes and checkpoints, not what FSDP does.
_NOT_PLANNED = {
    "accelerator": "it picks the device",
    "parallel_devices": "it lists the devices (pass devices= for their number)",
    "cluster_environment": "it is how processes find each other",
    "checkpoint_io": "it only writes checkpoints",
    "precision_plugin": "pass precision= (the Trainer's precision string) instead",
    "process_group_backend": "it picks the collective library",
    "timeout": "it is the collectives' timeout",
    "state_dict_type": "it only picks the checkpoint format",
}


def from_lightning(
    *,
    strategy: Any = None,
    precision: str = "32-true",
    devices: int | str | list[int] | tuple[int, ...] = 8,
    num_nodes: int = 1,
    **strategy_kwargs: Any,
) -> TrainerConfig:
    """The :func:`fsdpviz.analyze` arguments of ``Trainer(strategy=FSDPStrategy(**strategy_kwargs),
    precision=precision, devices=devices, num_nodes=num_nodes)``: Lightning resolves
    nothing against the model, so none is needed. ``strategy=`` takes the strategy instead:
    an ``FSDPStrategy`` already built, or a name Lightning registers (``"fsdp"``,
    ``"fsdp_cpu_offload"``). ``devices`` is per node, as the Trainer takes it.

    Example::

        plan = fsdpviz.from_lightning(
            precision="bf16-mixed", devices=8, sharding_strategy="SHARD_GRAD_OP",
            auto_wrap_policy={LlamaDecoderLayer},
            activation_checkpointing_policy={LlamaDecoderLayer},
        )
        report = fsdpviz.analyze(model, inputs, **plan)
    """
    try:
        from lightning.pytorch.plugins.precision import FSDPPrecision
        from lightning.pytorch.strategies import FSDPStrategy
    except ImportError as e:
        raise ConfigError(
            "from_lightning builds the strategy with Lightning itself: pip install lightning"
        ) from e
    notes: list[str] = []
    where = "FSDPStrategy"
    per_node = _devices(devices)
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ConfigError(f"num_nodes must be a positive int, got {num_nodes!r}")
    if strategy is not None and strategy_kwargs:
        raise ConfigError(
            f"pass strategy=FSDPStrategy(...) or the strategy's arguments "
            f"({', '.join(sorted(strategy_kwargs))}), not both: put them in the FSDPStrategy"
        )
    for key in sorted(set(strategy_kwargs) & set(_NOT_PLANNED)):
        note(notes, f"{where}({key}=...) is not applied: {_NOT_PLANNED[key]}")
    if strategy is None:
        _check_arguments(strategy_kwargs, FSDPStrategy)
    else:
        strategy = _strategy(strategy)
    try:
        if strategy is None:
            strategy = FSDPStrategy(**strategy_kwargs)
        plugin = getattr(strategy, "_precision_plugin", None)
        if plugin is None:
            plugin = FSDPPrecision(precision)  # type: ignore[arg-type]
        mixed = strategy.mixed_precision or plugin.mixed_precision_config
    except (TypeError, ValueError, RuntimeError) as e:
        raise ConfigError(f"Lightning rejects these arguments: {e}") from None
    kwargs: dict[str, Any] = dict(strategy.kwargs)
    kwargs.pop("device_id", None)
    kwargs["world_size"] = per_node * num_nodes
    kwargs["sharding_strategy"] = strategy.sharding_strategy
    kwargs["mixed_precision"] = mixed
    if kwargs.get("process_group") is not None:
        raise ConfigError(
            f"{where}(process_group=...): fsdpviz plans from sizes, not process groups; pass "
            "device_mesh=(replicas, shard) for hybrid sharding, or nothing to shard over all "
            "devices x num_nodes ranks"
        )
    kwargs.pop("process_group", None)
    mesh = kwargs.pop("device_mesh", None)
    if strategy.sharding_strategy.name in HYBRID_STRATEGIES:
        kwargs["shard_group_size"] = _shard_group(mesh, per_node, kwargs["world_size"])
    elif mesh is not None and len(_mesh_shape(mesh)) != 1:
        raise ConfigError(
            f"{where}(device_mesh={mesh!r}) is a 2-D mesh, which FSDP1 takes only with "
            "sharding_strategy='HYBRID_SHARD' or '_HYBRID_SHARD_ZERO2' (replicas x shard)"
        )
    if strategy.cpu_offload is not None and strategy.cpu_offload.offload_params:
        kwargs["cpu_offload"] = strategy.cpu_offload
    checkpointing = strategy._activation_checkpointing_kwargs
    if "auto_wrap_policy" in checkpointing:
        policy = checkpointing["auto_wrap_policy"]
        classes = getattr(policy, "_module_classes", None)
        if classes is None:
            raise ConfigError(
                f"{where}: activation_checkpointing_policy {policy!r} is not a set of classes "
                "or a ModuleWrapPolicy; fsdpviz plans checkpointing by module classes"
            )
        kwargs["activation_checkpointing"] = sorted(classes, key=lambda c: c.__name__)
    elif "check_fn" in checkpointing:
        kwargs["activation_checkpointing"] = checkpointing["check_fn"]
    config = cast("AnalyzeKwargs", kwargs)  # FSDPStrategy's keywords are FullyShardedDataParallel's
    return TrainerConfig(f"Lightning FSDPStrategy, precision={precision!r}", config, notes)


def _devices(devices: Any) -> int:
    """Lightning's ``devices`` (per node) as a number: an int, a list of device indices, or
    digits; ``"auto"`` and ``-1`` depend on the machine the job runs on."""
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1:
        return devices
    raise ConfigError(
        f"devices={devices!r}: the number of devices per node decides the world size (and "
        "hybrid sharding's shard group); pass it as the job has it, e.g. devices=8"
    )


def _check_arguments(kwargs: dict[str, Any], strategy_cls: Any) -> None:
    """FSDPStrategy passes the keywords it does not know to FullyShardedDataParallel, which
    would fail on a misspelled one when the job starts: say so now."""
    known = set(inspect.signature(strategy_cls.__init__).parameters) - {"self", "kwargs"}
    fsdp = set(inspect.signature(FullyShardedDataParallel.__init__).parameters) - {"self"}
    for key in kwargs:
        if key not in known and key not in fsdp:
            tip = did_you_mean(key, sorted(known | fsdp))
            raise ConfigError(
                f"FSDPStrategy has no argument {key!r}, and FullyShardedDataParallel, which "
                f"gets the ones FSDPStrategy does not take, has none either{tip}"
            )


def _strategy(strategy: Any) -> Any:
    """An FSDPStrategy from ``strategy=``: the instance, or the strategy Lightning registers
    under that name."""
    if isinstance(strategy, str):
        from lightning.pytorch.strategies import StrategyRegistry

        names = sorted(n for n in StrategyRegistry if "fsdp" in n)
        if strategy not in names:
            close = difflib.get_close_matches(strategy, names, n=1)
            tip = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"strategy={strategy!r} is not an FSDP strategy Lightning registers; {tip}"
                f"use one of {', '.join(names)} or FSDPStrategy(...)"
            )
        return StrategyRegistry.get(strategy)
    needed = ("kwargs", "sharding_strategy", "cpu_offload", "mixed_precision")
    if not all(hasattr(strategy, a) for a in needed) or not hasattr(
        strategy, "_activation_checkpointing_kwargs"
    ):
        kind = type(strategy).__name__
        extra = (
            " (ModelParallelStrategy applies FSDP2 in your configure_model: pass the modules "
            "you call fully_shard on to analyze as fully_shard=[...])"
            if kind == "ModelParallelStrategy"
            else ""
        )
        raise ConfigError(
            f"strategy={kind} is not Lightning's FSDPStrategy; from_lightning reads "
            f"FSDPStrategy(...) or a registered FSDP strategy name{extra}"
        )
    return strategy


def _mesh_shape(mesh: Any) -> tuple[int, ...]:
    if isinstance(mesh, (tuple, list)) and all(isinstance(n, int) for n in mesh):
        return tuple(mesh)
    shape = getattr(mesh, "shape", None)
    if shape is not None:
        return tuple(int(n) for n in shape)
    raise ConfigError(
        f"FSDPStrategy(device_mesh={mesh!r}) is not (replicas, shard) or a DeviceMesh"
    )


def _shard_group(mesh: Any, per_node: int, world: int) -> int:
    """Ranks one FlatParameter is sharded over under hybrid sharding."""
    if mesh is None:
        # FSDP1 without a process group: _init_intra_node_process_group(device_count())
        return per_node
    shape = _mesh_shape(mesh)
    if len(shape) != 2 or shape[0] * shape[1] != world:
        raise ConfigError(
            f"FSDPStrategy(device_mesh={mesh!r}) must be (replicas, shard) with replicas x "
            f"shard = devices x num_nodes = {world}"
        )
    return shape[1]
