"""An accelerate config file (``accelerate config`` / ``accelerate launch --config_file``)
as the FSDP arguments accelerate passes for it.

What ``accelerate launch`` does with each key is followed as accelerate 1.x does it
(``commands/launch.py`` fills its arguments from the file, ``utils/launch.py`` exports them,
``FullyShardedDataParallelPlugin`` reads them, ``Accelerator.prepare_model`` wraps):

- FSDP1: ``FullyShardedDataParallel(model, sharding_strategy=..., auto_wrap_policy=...,
  mixed_precision=..., backward_prefetch=..., forward_prefetch=..., use_orig_params=...)``.
  Launch always exports ``fsdp_sharding_strategy`` (default ``FULL_SHARD``), which
  ``prepare_model`` prefers to ``fsdp_reshard_after_forward``.
- FSDP2: ``fully_shard`` on every module the wrap policy picks (bottom-up), on the input
  embedding, on the final norm with the output embedding (``reshard_after_forward=False``),
  then on the root (torch's default resharding).
- ``parallelism_config`` (FSDP2): the device mesh of accelerate's ``ParallelismConfig``
  (HSDP, context parallelism), as ``analyze(mesh=...)``; tensor parallelism there applies
  the model's own plan, which is not read (``configs/accelerate_mesh.py``).
- ``fsdp_activation_checkpointing``: the modules the wrap policy picks are checkpointed.
- ``mixed_precision``: ``bf16`` / ``fp16`` (``fp8`` computes in bf16) for parameters,
  reduction and buffers (FSDP1) or outputs (FSDP2).
- ``dynamo_config``: ``dynamo_backend: INDUCTOR`` compiles the wrapped model
  (``torch.compile``, ``analyze(..., compile=True)``), or with
  ``dynamo_use_regional_compilation`` each repeated block (``compile_regions``: the
  transformer layer classes); other backends do not fuse kernels and are costed eager.

Older accelerate releases wrote other names, and files written by them are read as the
installed accelerate reads them: ``fp16: true`` is ``mixed_precision: fp16``,
``dynamo_backend: X`` is ``dynamo_config: {dynamo_backend: X}``, fsdp_config keys without
the ``fsdp_`` prefix take it, and ``fsdp_backward_prefetch_policy`` (accelerate before
0.27; its docs still show it) is ``fsdp_backward_prefetch`` where the installed accelerate
still reads it, and otherwise prefetches nothing, which a note says.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from fsdpviz.configs.accelerate_mesh import accelerate_mesh
from fsdpviz.configs.common import TrainerConfig, check_keys, module_class, note
from fsdpviz.errors import ConfigError
from fsdpviz.plan.option_specs import RESHARD
from fsdpviz.plan.options import DEFAULT_WORLD_SIZE

if TYPE_CHECKING:
    from fsdpviz.api.keywords import AnalyzeKwargs

RESHARD_KEY = RESHARD.trainer_keys["accelerate"]
"""accelerate's ``fsdp_config`` key for FSDP2's resharding after forward (``true`` or
``false`` for every group it wraps); FSDP1's sharding strategy overrides it."""

# fsdp_config keys accelerate reads and fsdpviz applies.
_FSDP_KEYS = {
    "fsdp_version",
    "fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params",
    "fsdp_sharding_strategy",
    RESHARD_KEY,
    "fsdp_backward_prefetch",
    "fsdp_forward_prefetch",
    "fsdp_use_orig_params",
    "fsdp_activation_checkpointing",
    "fsdp_offload_params",
}
_FSDP_NOT_PLANNED = {
    "fsdp_state_dict_type": "it only picks the checkpoint format",
    "fsdp_cpu_ram_efficient_loading": "it is how weights are loaded, before training",
    "fsdp_sync_module_states": "it is one broadcast at construction, before any iteration",
    "fsdp_activation_checkpointing_offload": "offloading saved activations is not modelled",
    "fsdp_ignored_modules": "ignored modules are not read from a config (pass ignored_modules=)",
}
# Top-level keys: where and how processes start, not what one rank does.
_LAUNCH_KEYS = {
    "compute_environment", "debug", "distributed_type", "downcast_bf16", "enable_cpu_affinity",
    "machine_rank", "main_training_function", "num_machines", "num_processes", "rdzv_backend",
    "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "gpu_ids",
    "main_process_ip", "main_process_port", "mixed_precision", "fsdp_config", "dynamo_config",
    "parallelism_config",
}  # fmt: skip
_DYNAMO_KEYS = {
    "dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
}  # fmt: skip
# Further keys of accelerate's ClusterConfig and SageMakerConfig (accelerate config writes
# them): TPU pods, launch commands, other backends' settings, SageMaker's job.
_CLUSTER_KEYS = {
    "command_file", "commands", "tpu_name", "tpu_zone", "tpu_vm", "mpirun_config",
    "ipex_config", "deepspeed_config", "megatron_lm_config", "ec2_instance_type",
    "iam_role_name", "image_uri", "profile", "region", "base_job_name", "pytorch_version",
    "transformers_version", "py_version", "sagemaker_inputs_file", "sagemaker_metrics_file",
    "additional_args",
}  # fmt: skip
# Old fsdp_config names -> (the current name, the accelerate release that stopped reading it;
# None: accelerate still reads the old name).
_RENAMED = {"fsdp_backward_prefetch_policy": ("fsdp_backward_prefetch", (0, 27))}
_NOT_PLANNED = {
    "fp8_config": "FP8 matmuls are not modelled (computed as bf16)",
}
_STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
_MIXED = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def from_accelerate(
    config: str | Path | Mapping[str, Any], model: nn.Module, *, trainer: bool = True
) -> TrainerConfig:
    """The :func:`fsdpviz.analyze` arguments of an accelerate FSDP config for ``model``.

    ``config`` is the YAML file's path (or its contents as a dict). Keys that do not
    change the plan, or that fsdpviz does not model, each give one :class:`ConfigNote`
    line; an unknown key is an error.

    A ``peft`` model (``get_peft_model``) is planned as transformers' ``Trainer`` (and TRL's
    trainers, built on it) prepares it (``trainer=True``, the default): it replaces the
    config's wrap policy with peft's ``fsdp_auto_wrap_policy`` (each adapter's linear a unit
    of its own, and each transformer layer), which accelerate's FSDP2 path does not read (no
    layer is sharded on its own). ``trainer=False``: a script that calls
    ``accelerator.prepare`` itself, which keeps the config's policy.

    Example::

        plan = fsdpviz.from_accelerate("fsdp.yaml", model)
        report = fsdpviz.analyze(model, inputs, **plan)
    """
    data, where = _load(config)
    data = _current_names(data)
    known = _LAUNCH_KEYS | _CLUSTER_KEYS | set(_NOT_PLANNED)
    notes = check_keys(data, known, where, ignored=_NOT_PLANNED)
    if data.get("distributed_type", "FSDP") != "FSDP":
        raise ConfigError(
            f"{where}: distributed_type is {data['distributed_type']!r}, not FSDP; this "
            "config does not shard with FSDP"
        )
    fsdp = data.get("fsdp_config") or {}
    if not isinstance(fsdp, Mapping):
        raise ConfigError(
            f"{where}: fsdp_config must be a mapping of keys (fsdp_version: 1, ...), got {fsdp!r}"
        )
    fsdp = {k if k.startswith("fsdp_") else f"fsdp_{k}": v for k, v in fsdp.items()}
    fsdp = _current_fsdp_names(fsdp, f"{where} fsdp_config", notes)
    notes += check_keys(fsdp, _FSDP_KEYS, f"{where} fsdp_config", ignored=_FSDP_NOT_PLANNED)
    version = _int(fsdp.get("fsdp_version", 1), "fsdp_version", where)
    if version not in (1, 2):
        raise ConfigError(f"{where}: fsdp_version must be 1 or 2, got {version!r}")
    kwargs: AnalyzeKwargs = {
        "world_size": _int(data.get("num_processes", 1), "num_processes", where)
    }
    section = data.get("parallelism_config")
    if kwargs["world_size"] < 1:
        note(notes, f"{where}: num_processes={kwargs['world_size']} leaves the number of "
                    f"processes to the launcher; planned for {DEFAULT_WORLD_SIZE} ranks (pass "
                    "world_size=N, or --world-size N, for the job's)")  # fmt: skip
        kwargs["world_size"] = DEFAULT_WORLD_SIZE
    dims = accelerate_mesh(section, kwargs["world_size"], version, where, notes)
    if dims is not None and len(dims.device_mesh) > 1:  # HSDP and/or cp: the mesh it builds
        del kwargs["world_size"]
        kwargs["mesh"] = dims.mesh_arg  # ("dp_replicate", 2, "dp_shard", 4)
    wrap = _wrap_policy(fsdp, model, where)
    if trainer and _is_peft(model):
        wrap = _peft_wrap(fsdp, model, where, version, wrap, notes)
    mixed = data.get("mixed_precision")
    mixed = "no" if mixed is None or mixed is False else str(mixed).lower()
    if mixed not in ("no", *_MIXED):
        raise ConfigError(f"{where}: mixed_precision must be no, bf16, fp16 or fp8, got {mixed!r}")
    if mixed == "fp8":
        note(
            notes,
            f"{where}: mixed_precision='fp8' is planned as bf16 (FP8 matmuls are not modelled)",
        )
    dtype = _MIXED.get(mixed)
    if version == 1:
        kwargs.update(_fsdp1(fsdp, wrap, dtype, where, notes))
    else:
        kwargs.update(_fsdp2(fsdp, wrap, dtype, model, where, notes))
    if _flag(
        fsdp.get("fsdp_activation_checkpointing", False), "fsdp_activation_checkpointing", where
    ):
        if wrap is not None and wrap.kind == "peft" and version == 2:
            raise ConfigError(
                f"{where}: fsdp_activation_checkpointing with fsdp_version: 2 and a peft model "
                "under transformers' Trainer fails: accelerate's FSDP2 path does not read "
                "peft's wrap policy and calls it anyway (TypeError: 'NoneType' object is not "
                "callable). Checkpoint with the Trainer instead (TrainingArguments("
                "gradient_checkpointing=True): analyze(..., activation_checkpointing=[the "
                "layer class])) and set fsdp_activation_checkpointing: false"
            )
        if wrap is None:
            note(notes, f"{where}: fsdp_activation_checkpointing without a wrap policy "
                        "checkpoints nothing")  # fmt: skip
        else:
            kwargs["activation_checkpointing"] = wrap.checkpointed
    dynamo = cast("Mapping[str, object]", data.get("dynamo_config") or {})
    compiled = _dynamo(dict(dynamo), wrap, where, notes)
    if compiled:
        kwargs["compile"] = compiled
    return TrainerConfig(f"accelerate config {where}", kwargs, notes)


def _dynamo(
    dynamo: dict[str, object], wrap: _Wrap | None, where: str, notes: list[str]
) -> bool | list[type[nn.Module]]:
    """accelerate's ``TorchDynamoPlugin``: ``prepare_model`` compiles the wrapped model, or
    with regional compilation each repeated block."""
    notes += check_keys(dynamo, _DYNAMO_KEYS, f"{where} dynamo_config", ignored={})
    backend = str(dynamo.get("dynamo_backend") or "NO").upper()
    if backend == "NO":
        return False
    if backend != "INDUCTOR":
        note(
            notes,
            f"{where}: dynamo_backend {backend} does not fuse kernels as Inductor does; the "
            "compute is costed eager",
        )
        return False
    mode = str(dynamo.get("dynamo_mode") or "default")
    if mode != "default":
        note(
            notes,
            f"{where}: dynamo_mode {mode!r} (autotuned matrix multiplies, CUDA graphs) is "
            "costed as the default mode: fused memory-bound kernels, the same matrix multiplies",
        )
    regional = _flag(dynamo.get("dynamo_use_regional_compilation", False))
    if regional and wrap is not None and wrap.kind == "transformer" and wrap.classes:
        return sorted(wrap.classes, key=lambda c: c.__name__)
    return True


def _load(config: str | Path | Mapping[str, Any]) -> tuple[dict[str, object], str]:
    if isinstance(config, Mapping):
        return dict(config), "accelerate config"
    import yaml  # lazy: optional (fsdpviz[accelerate])

    path = Path(config)
    if not path.is_file():
        raise ConfigError(f"accelerate config {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path} is not valid YAML{at}: {problem}; an accelerate config is YAML as "
            "`accelerate config` writes it (key: value, nested keys indented with spaces)"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file; pass the accelerate config YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: an accelerate config is a YAML mapping of keys (distributed_type: FSDP, "
            f"fsdp_config: ...), got {type(data).__name__ if data is not None else 'an empty file'}"
        )
    return data, path.name


def _current_names(data: dict[str, object]) -> dict[str, object]:
    """Top-level keys of older accelerate releases as accelerate reads them
    (``BaseConfig.process_config``): ``fp16: true`` -> ``mixed_precision: fp16``,
    ``dynamo_backend: X`` -> ``dynamo_config``."""
    data = dict(data)
    if "fp16" in data:
        fp16 = data.pop("fp16")
        if "mixed_precision" not in data:
            data["mixed_precision"] = "fp16" if fp16 else None
    if "dynamo_backend" in data:
        backend = data.pop("dynamo_backend")
        if "dynamo_config" not in data:
            no = str(backend).upper() == "NO"
            data["dynamo_config"] = {} if no else {"dynamo_backend": backend}
    return data


def _accelerate_version() -> tuple[int, ...] | None:
    try:
        text = version("accelerate")
    except PackageNotFoundError:
        return None
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _current_fsdp_names(fsdp: dict[str, object], where: str, notes: list[str]) -> dict[str, object]:
    """fsdp_config keys of older accelerate releases, read as the installed accelerate reads
    them (not installed: as the current release does)."""
    installed = _accelerate_version()
    out = dict(fsdp)
    for old, (new, dropped) in _RENAMED.items():
        if old not in out:
            continue
        value = out.pop(old)
        release = f"accelerate {'.'.join(map(str, installed))}" if installed else "accelerate"
        if installed is not None and installed < dropped:
            out[new] = value  # read under its old name, which wins over the new one
        elif new in out:
            note(notes, f"{where}: {old}={value!r} is the old name of {new}, which {release} "
                        f"no longer reads; {new}={out[new]!r} applies")  # fmt: skip
        else:
            since = ".".join(map(str, dropped))
            note(notes, f"{where}: {old}={value!r} is the old name of {new}: accelerate "
                        f"stopped reading it in {since}, so {release} runs without it "
                        f"(planned so); rename it to {new} to apply it")  # fmt: skip
    return out


def _int(value: Any, key: str, where: str) -> int:
    """An integer setting as accelerate reads it (``int(value)``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        pass
    fix = "write the number in digits"
    try:
        number = float(str(value))
    except ValueError:
        number = None
    if number is not None and number.is_integer():
        fix = f"write {int(number)}"
    raise ConfigError(
        f"{where}: {key} must be an integer, got {value!r}; accelerate reads it with int(), "
        f"so {fix}"
    )


def _flag(value: Any, key: str = "", where: str = "") -> bool:
    """accelerate's ``str_to_bool``: yes/true/1 and no/false/0."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    what = f"{where}: {key} must be" if key else "expected"
    raise ConfigError(f"{what} true or false, got {value!r}")


class _Wrap:
    """The wrap policy accelerate builds: its FSDP1 policy and which modules it picks
    (``kind`` ``"peft"``: peft's ``fsdp_auto_wrap_policy``, ``policy``)."""

    def __init__(
        self,
        kind: str,
        classes: set[type[nn.Module]],
        min_num_params: int,
        policy: Any = None,
    ) -> None:
        self.kind = kind
        self.classes = classes
        self.min_num_params = min_num_params
        self.policy = policy

    def fsdp1(self) -> Any:
        if self.kind == "peft":
            return self.policy
        if self.kind == "transformer":
            return functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls=self.classes
            )
        return functools.partial(size_based_auto_wrap_policy, min_num_params=self.min_num_params)

    def picks(self, module: nn.Module) -> bool:
        """accelerate's FSDP2 policy (``fsdp2_prepare_auto_wrap_policy``), which finds no
        layer policy in peft's."""
        if self.kind == "peft":
            return False
        if self.kind == "transformer":
            return bool(self.classes) and isinstance(module, tuple(self.classes))
        return sum(p.numel() for p in module.parameters()) > self.min_num_params

    @property
    def checkpointed(self) -> Any:
        """What ``apply_activation_checkpointing(auto_wrap_policy=...)`` checkpoints."""
        if self.kind == "peft":  # its policy asked of one module at a time
            return lambda m: bool(self.policy(module=m, recurse=False, nonwrapped_numel=0))
        if self.kind == "transformer":
            return sorted(self.classes, key=lambda c: c.__name__)
        return self.picks


def _wrap_policy(fsdp: dict[str, object], model: nn.Module, where: str) -> _Wrap | None:
    kind = str(fsdp.get("fsdp_auto_wrap_policy") or "NO_WRAP").upper()
    if kind == "NO_WRAP":
        return None
    if kind == "TRANSFORMER_BASED_WRAP":
        names = fsdp.get("fsdp_transformer_layer_cls_to_wrap")
        if names is None:
            names = list(getattr(model, "_no_split_modules", None) or [])
        elif isinstance(names, str):
            names = names.split(",")
        classes = {
            module_class(model, str(n).strip(), where) for n in cast("Iterable[object]", names)
        }
        return _Wrap("transformer", classes, 0)
    if kind == "SIZE_BASED_WRAP":
        threshold = _int(fsdp.get("fsdp_min_num_params", 100_000_000), "fsdp_min_num_params", where)
        return None if threshold <= 0 else _Wrap("size", set(), threshold)
    raise ConfigError(
        f"{where}: fsdp_auto_wrap_policy {kind!r} is not valid; use TRANSFORMER_BASED_WRAP, "
        "SIZE_BASED_WRAP or NO_WRAP"
    )


def _is_peft(model: nn.Module) -> bool:
    peft = sys.modules.get("peft")  # a peft model's library is loaded
    return peft is not None and isinstance(model, peft.PeftModel)


def _peft_wrap(
    fsdp: dict[str, object], model: nn.Module, where: str, version: int, wrap: _Wrap | None,
    notes: list[str],
) -> _Wrap:  # fmt: skip
    """transformers' Trainer on a peft model (``update_fsdp_plugin_peft``): peft's
    ``fsdp_auto_wrap_policy``, whose layer classes ``accelerate launch`` passes in the
    environment (``FSDP_TRANSFORMER_CLS_TO_WRAP``, from fsdp_transformer_layer_cls_to_wrap)."""
    from peft.utils.other import fsdp_auto_wrap_policy  # lazy: optional

    names = fsdp.get("fsdp_transformer_layer_cls_to_wrap")
    if isinstance(names, (list, tuple)):
        names = ",".join(str(n) for n in names)
    key = "FSDP_TRANSFORMER_CLS_TO_WRAP"
    before = os.environ.get(key)
    try:
        if names is not None:
            os.environ[key] = str(names)
        elif before is not None:  # launch would not pass the caller's: it is not in the file
            del os.environ[key]
        policy = fsdp_auto_wrap_policy(model)  # type: ignore[no-untyped-call]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: peft's fsdp_auto_wrap_policy refuses this model: {e}") from e
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    classes = wrap.classes if wrap is not None else set()
    what = (
        "peft's fsdp_auto_wrap_policy wraps each adapter's linear as a unit of its own and "
        "each transformer layer"
        if version == 1
        else "it sets peft's fsdp_auto_wrap_policy, which accelerate's FSDP2 path does not "
        "read, so no layer is sharded on its own (only the embeddings, the final norm with "
        "the head, and the root)"
    )
    note(
        notes,
        f"{where}: a peft model, planned as transformers' Trainer prepares it: {what}; "
        "from_accelerate(..., trainer=False) plans the config's policy, as a script calling "
        "accelerator.prepare keeps it",
    )
    return _Wrap("peft", classes, 0, policy)


def _named(value: Any, names: list[str], key: str, where: str) -> str:
    """A name or accelerate's 1-based number for it."""
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(names):
        return names[int(text) - 1]
    if text not in names:
        raise ConfigError(f"{where}: {key} must be one of {', '.join(names)}, got {value!r}")
    return text


def _fsdp1(
    fsdp: dict[str, object], wrap: _Wrap | None, dtype: torch.dtype | None, where: str,
    notes: list[str],
) -> AnalyzeKwargs:  # fmt: skip
    strategy = _named(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD"), _STRATEGIES,
                      "fsdp_sharding_strategy", where)  # fmt: skip
    asked = fsdp.get(RESHARD_KEY)
    if asked is not None and str(asked).upper() != strategy:
        note(
            notes,
            f"{where}: fsdp_reshard_after_forward={asked!r} is not what accelerate runs: "
            f"launch exports fsdp_sharding_strategy (here {strategy}), which "
            "Accelerator.prepare_model prefers; set fsdp_sharding_strategy to change it",
        )
    name = "_HYBRID_SHARD_ZERO2" if strategy == "HYBRID_SHARD_ZERO2" else strategy
    kwargs: AnalyzeKwargs = {
        "sharding_strategy": ShardingStrategy[name],
        "auto_wrap_policy": None if wrap is None else wrap.fsdp1(),
        "backward_prefetch": None,
        "forward_prefetch": _flag(
            fsdp.get("fsdp_forward_prefetch", False), "fsdp_forward_prefetch", where
        ),
        "use_orig_params": _flag(
            fsdp.get("fsdp_use_orig_params", True), "fsdp_use_orig_params", where
        ),
        "limit_all_gathers": True,
    }
    prefetch = fsdp.get("fsdp_backward_prefetch")
    if prefetch is not None:
        chosen = _named(prefetch, _PREFETCH, "fsdp_backward_prefetch", where)
        kwargs["backward_prefetch"] = None if chosen == "NO_PREFETCH" else BackwardPrefetch[chosen]
    if dtype is not None:
        kwargs["mixed_precision"] = MixedPrecision(
            param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype
        )
    if _flag(fsdp.get("fsdp_offload_params", False), "fsdp_offload_params", where):
        kwargs["cpu_offload"] = CPUOffload(offload_params=True)
    return kwargs


def _fsdp2(
    fsdp: dict[str, object], wrap: _Wrap | None, dtype: torch.dtype | None, model: nn.Module,
    where: str, notes: list[str],
) -> AnalyzeKwargs:  # fmt: skip
    for key in ("fsdp_sharding_strategy", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
                "fsdp_use_orig_params"):  # fmt: skip
        if key in fsdp:
            note(notes, f"{where}: {key} is an FSDP1 setting; accelerate does not use it "
                        "with fsdp_version: 2" + (
                            " (accelerate to-fsdp2 turns it into fsdp_reshard_after_forward)"
                            if key == "fsdp_sharding_strategy" else ""))  # fmt: skip
    raf_given = fsdp.get(RESHARD_KEY, True)
    if str(raf_given).upper() in _STRATEGIES:
        as_bool = str(raf_given).upper() in ("FULL_SHARD", "HYBRID_SHARD")
        raise ConfigError(
            f"{where}: fsdp_reshard_after_forward={raf_given!r} is FSDP1's sharding strategy; "
            "with fsdp_version: 2 accelerate takes true or false (accelerate to-fsdp2 writes "
            f"{str(as_bool).lower()} for {str(raf_given).upper()})"
        )
    raf = _flag(raf_given, RESHARD_KEY, where)
    names = {m: n for n, m in model.named_modules()}
    sharded: list[nn.Module] = []
    if wrap is not None:
        sharded = [m for m in _bottom_up(model)[:-1] if wrap.picks(m)]
    calls: list[Any] = [names[m] for m in sharded]
    reshard: dict[str, bool] = {names[m]: raf for m in sharded}
    embed_fn = getattr(model, "get_input_embeddings", None)
    head_fn = getattr(model, "get_output_embeddings", None)
    embed = embed_fn() if callable(embed_fn) else None
    head = head_fn() if callable(head_fn) else None
    tied = (
        embed is not None
        and head is not None
        and getattr(embed, "weight", None) is getattr(head, "weight", 0)
    )
    if not tied and embed is not None and embed not in sharded:
        calls.append(names[embed])
        reshard[names[embed]] = raf
        sharded.append(embed)
    tail = [m for m in ((_final_norm(model), embed, head) if tied else (_final_norm(model), head))
            if m is not None and m not in sharded]  # fmt: skip
    if tail:
        group = tuple(names[m] for m in tail)
        calls.append(group if len(group) > 1 else group[0])
        reshard[", ".join(group)] = False
    kwargs: AnalyzeKwargs = {"fully_shard": calls, "reshard_after_forward": reshard}
    if dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype
        )
        low = sorted({str(p.dtype) for p in model.parameters()
                      if p.requires_grad and p.dtype != torch.float32})  # fmt: skip
        if low:
            note(notes, f"{where}: accelerate casts the {', '.join(low)} parameters that "
                        "require grad to float32 before fully_shard when mixed precision is "
                        "on; this model is planned as it is")  # fmt: skip
    if _flag(fsdp.get("fsdp_offload_params", False), "fsdp_offload_params", where):
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def _bottom_up(model: nn.Module) -> list[nn.Module]:
    """accelerate's ``get_module_children_bottom_up``: every module after its children."""
    out: list[nn.Module] = []
    seen: set[nn.Module] = set()

    def visit(m: nn.Module) -> None:
        for child in m.children():
            visit(child)
        if m not in seen:
            seen.add(m)
            out.append(m)

    visit(model)
    return out


def _final_norm(model: nn.Module) -> nn.Module | None:
    """accelerate's ``_find_final_norm``: the base model's last direct child named *Norm*."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if not isinstance(base, nn.Module):
        return None
    found = None
    for _, child in base.named_children():
        if "Norm" in type(child).__name__:
            found = child
    return found
