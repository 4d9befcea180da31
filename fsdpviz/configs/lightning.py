"""Lightning's ``FSDPStrategy(...)`` keyword arguments as the FSDP arguments Lightning passes.

Lightning itself builds the strategy (``lightning.pytorch.strategies.FSDPStrategy``): it turns
a set of layer classes into ``ModuleWrapPolicy``, a strategy name into ``ShardingStrategy``,
``cpu_offload=True`` into ``CPUOffload``, sets ``use_orig_params=True``, and picks
``MixedPrecision`` from the trainer's ``precision`` (``FSDPPrecision``); fsdpviz reads the
result, so a plan follows the installed Lightning exactly.
"""

from __future__ import annotations

from typing import Any

from fsdpviz.configs.common import TrainerConfig, note
from fsdpviz.errors import ConfigError

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
    precision: str = "32-true",
    devices: int = 8,
    num_nodes: int = 1,
    **strategy_kwargs: Any,
) -> TrainerConfig:
    """The :func:`fsdpviz.analyze` arguments of ``Trainer(strategy=FSDPStrategy(**strategy_kwargs),
    precision=precision, devices=devices, num_nodes=num_nodes)``: Lightning resolves
    nothing against the model, so none is needed.

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
    for key in sorted(set(strategy_kwargs) & set(_NOT_PLANNED)):
        note(notes, f"{where}({key}=...) is not applied: {_NOT_PLANNED[key]}")
    try:
        strategy = FSDPStrategy(**strategy_kwargs)
        mixed = strategy.mixed_precision or FSDPPrecision(precision).mixed_precision_config  # type: ignore[arg-type]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"Lightning rejects these arguments: {e}") from None
    kwargs: dict[str, Any] = dict(strategy.kwargs)
    kwargs.pop("device_id", None)
    kwargs["world_size"] = devices * num_nodes
    kwargs["sharding_strategy"] = strategy.sharding_strategy
    kwargs["mixed_precision"] = mixed
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
    return TrainerConfig(f"Lightning FSDPStrategy, precision={precision!r}", kwargs, notes)
