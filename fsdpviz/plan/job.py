"""Options of the training job around FSDP that ``analyze`` takes for both APIs.

- ``grad_accum=N``: ``N`` micro-steps per optimizer step, the first ``N - 1`` without
  gradient synchronisation (FSDP1 ``with model.no_sync():``, FSDP2
  ``model.set_requires_gradient_sync(False)``), the last one synchronised. The report holds
  every micro-step as FSDP issues it.
- ``compile``: the model runs under ``torch.compile``: ``True`` (the whole model), or module
  classes compiled one by one (torchtitan compiles each block). It changes the kernels, not
  FSDP's schedule; the time model costs the compute as compiled (:mod:`fsdpviz.cost.kernels`).
- ``float8``: torchao's float8 training of ``nn.Linear`` as torchtitan runs it: ``True``
  (tensorwise scaling, every linear whose dimensions divide by 16), or torchtitan's
  ``[float8]`` / ``[quantize.linear.float8]`` keys as a dict
  (``enable_fsdp_float8_all_gather``, ``recipe_name``, ``filter_fqns``, ...).
- ``float32_matmul_precision``: ``"highest"``, ``"high"`` or ``"medium"``, as
  ``torch.set_float32_matmul_precision`` takes it (default: the process's setting when
  ``analyze`` runs): whether float32 matrix multiplies run on TF32 tensor cores.

Example::

    fsdpviz.analyze(model, ids, fully_shard=[Block], grad_accum=4, compile=[Block],
                    float8={"enable_fsdp_float8_all_gather": True})
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, cast, get_args

from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.schema.keywords import MatmulPrecision
from fsdpviz.schema.names import param_names
from fsdpviz.schema.report import ModuleInfo

if TYPE_CHECKING:  # (torch is imported where it is used: the command line reads the names here)
    from torch import nn

FLOAT32_MATMUL_PRECISIONS: tuple[str, ...] = get_args(MatmulPrecision)
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
# torchtitan's Float8 / Float8Linear config keys; the ones that change no kernel or byte are
# accepted and ignored (emulation; precompute's one all-reduce of scales per step, whose
# scales' bytes the memory model counts)
_FLOAT8_KEYS = {
    "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
    "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate",
    "enable_float8_linear", "scaling_type_input", "scaling_type_weight",
    "scaling_type_grad_output",
}  # fmt: skip


class JobFields(TypedDict):
    """The ``ReportConfig`` fields of the job around FSDP (:meth:`JobOptions.config`)."""

    grad_accum: int
    compile: bool | tuple[str, ...]
    float8: dict[str, Any] | None  # Float8.to_dict(): torchtitan's keys
    float32_matmul_precision: str | None


@dataclass(frozen=True)
class Float8:
    """Float8 training of ``nn.Linear`` (torchao's ``Float8Linear``): the matrix multiplies
    of every linear that ``filter_fqns`` does not exclude (a substring of its FQN) and whose
    dimensions divide by 16 run in float8, their inputs cast (with an amax reduction) first;
    with ``enable_fsdp_float8_all_gather`` FSDP2 all-gathers those weights in float8, with
    ``precompute_float8_dynamic_scale_for_fsdp`` with the scales torchao's function of that
    name computes after each optimizer step."""

    recipe_name: str = "tensorwise"
    enable_fsdp_float8_all_gather: bool = False
    filter_fqns: tuple[str, ...] = ()
    precompute_float8_dynamic_scale_for_fsdp: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Its fields, torchtitan's float8 keys, as ``ReportConfig.float8`` states them:
        ``filter_fqns`` as a list, ``precompute_...`` only where True."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["filter_fqns"] = list(self.filter_fqns)
        if not self.precompute_float8_dynamic_scale_for_fsdp:
            del out["precompute_float8_dynamic_scale_for_fsdp"]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Float8:
        """Read :meth:`to_dict`'s output: a field missing or empty reads its default, the
        others as its default's type (``filter_fqns``: a tuple)."""
        fields = dataclasses.fields(cls)
        return cls(
            **{f.name: type(cast(Any, f.default))(d[f.name]) for f in fields if d.get(f.name)}
        )

    def picks(self, fqn: str, in_features: int, out_features: int) -> bool:
        """Whether the linear ``fqn`` of these dimensions trains in float8 (torchao's
        ``module_filter_fn`` with torchtitan's ``filter_fqns``)."""
        if any(f and f in fqn for f in self.filter_fqns):
            return False
        return in_features % 16 == 0 and out_features % 16 == 0


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """The job options of one ``analyze`` call (see the module docstring), checked and read
    once (:func:`parse_job_options`). Frozen: a change is :meth:`replace`, checked again.

    Attributes:
        grad_accum: micro-steps per optimizer step.
        compile: ``True`` (the whole model), ``False``, or the module classes compiled one
            by one.
        float8: torchao's float8 linears (:class:`Float8`), or ``None``.
        float32_matmul_precision: ``"highest"``, ``"high"`` or ``"medium"``.
        stated: the keys a report states (the options given that differ from a plain job).
    """

    grad_accum: int = 1
    compile: bool | tuple[type[nn.Module], ...] = False
    float8: Float8 | None = None
    float32_matmul_precision: str = "highest"
    stated: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_grad_accum(self.grad_accum)
        _check_precision(self.float32_matmul_precision)

    def replace(self, **changes: Any) -> JobOptions:
        """A copy with ``changes`` (fields by name), checked as a new one is.

        Example::

            job.replace(grad_accum=4)
        """
        return dataclasses.replace(self, **changes)

    def config(self) -> tuple[JobFields, tuple[str, ...]]:
        """The ``ReportConfig`` fields these options set, and the keys a report states (the
        options given that differ from a plain job, and the precision where it is not
        torch's default, so older reports read the same)."""
        compiled: bool | tuple[str, ...] = (
            tuple(c.__name__ for c in self.compile)
            if isinstance(self.compile, tuple)
            else self.compile
        )
        fields: JobFields = {
            "grad_accum": self.grad_accum,
            "compile": compiled,
            "float8": self.float8.to_dict() if self.float8 else None,
            "float32_matmul_precision": self.float32_matmul_precision,
        }
        keys = tuple(
            k
            for k in fields
            if k in self.stated
            or (k == "float32_matmul_precision" and self.float32_matmul_precision != "highest")
        )
        return fields, keys

    def compiled_modules(self, model: nn.Module) -> list[nn.Module] | None:
        """The modules compiled one by one (outermost picked), or None for the whole model."""
        if not isinstance(self.compile, tuple):
            return None
        from fsdpviz.schema.checkpointing import outermost_picked  # (it imports torch)

        classes = self.compile
        return outermost_picked(model, lambda m: isinstance(m, classes))

    def class_name(self, module: nn.Module, fqn: str) -> str:
        """``module``'s class as torch names it once the job is applied: a linear converted
        to float8 is torchao's ``Float8Linear`` (``convert_to_float8_training`` swaps it)."""
        from torch import nn  # lazy: the CLI reads this module before torch loads

        spec = self.float8
        if (
            spec is not None
            and isinstance(module, nn.Linear)
            and spec.picks(fqn, module.in_features, module.out_features)
        ):
            return "Float8Linear"
        return type(module).__name__

    def float8_modules(self, model: nn.Module) -> list[nn.Module]:
        """The ``nn.Linear`` modules of ``model`` that train in float8."""
        from torch import nn  # lazy: the CLI reads this module before torch loads

        if self.float8 is None:
            return []
        spec = self.float8
        return [
            m
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and spec.picks(name, m.in_features, m.out_features)
        ]


JOB_KEYS = frozenset(f.name for f in dataclasses.fields(JobOptions)) - {"stated"}
"""The keywords of this module, accepted by ``analyze`` for FSDP1 and FSDP2 (the fields of
:class:`JobOptions`)."""


def parse_job_options(kwargs: Mapping[str, Any], api: str) -> JobOptions:
    """Check the job options among ``kwargs`` (``api``: ``"FSDP1"`` or ``"FSDP2"``)."""
    values: dict[str, Any] = {"grad_accum": _check_grad_accum(kwargs.get("grad_accum", 1))}
    values["compile"] = _compile(kwargs.get("compile", False))
    values["float8"] = _float8(kwargs.get("float8"), api)
    # stated: those given that differ from a plain job (the precision by its value: config())
    plain = JobOptions()
    stated = tuple(k for k, v in values.items() if k in kwargs and v != getattr(plain, k))
    precision = kwargs.get("float32_matmul_precision")
    if precision is None:
        import torch  # lazy: the CLI reads this module before torch loads

        precision = torch.get_float32_matmul_precision()
    values["float32_matmul_precision"] = str(_check_precision(precision))
    return JobOptions(**values, stated=stated)


def _check_grad_accum(accum: Any) -> int:
    if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
        raise ConfigError(
            f"grad_accum must be a positive int (micro-steps per optimizer step), got {accum!r}"
        )
    return accum


def _check_precision(precision: Any) -> Any:
    if precision not in FLOAT32_MATMUL_PRECISIONS:
        raise ConfigError(
            f"float32_matmul_precision must be one of {', '.join(FLOAT32_MATMUL_PRECISIONS)} "
            f"(as torch.set_float32_matmul_precision takes it), got {precision!r}"
        )
    return precision


def _compile(value: Any) -> bool | tuple[type[nn.Module], ...]:
    from torch import nn  # lazy: the CLI reads this module before torch loads

    if isinstance(value, bool):
        return value
    if isinstance(value, type) and issubclass(value, nn.Module):
        return (value,)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        items = tuple(value)
        if items and all(isinstance(c, type) and issubclass(c, nn.Module) for c in items):
            return items
    raise ConfigError(
        "compile must be True (torch.compile on the whole model), False, or the module "
        f"classes compiled one by one (e.g. [TransformerBlock], as torchtitan does); got {value!r}"
    )


def _float8(value: Any, api: str) -> Float8 | None:
    if value is None or value is False:
        return None
    if value is True:
        return Float8()
    if isinstance(value, Float8):
        spec = value
    elif isinstance(value, Mapping):
        for key in value:
            if key not in _FLOAT8_KEYS:
                tip = did_you_mean(str(key), sorted(_FLOAT8_KEYS))
                raise ConfigError(f"float8: unknown key {key!r}{tip}")
        if value.get("enable_float8_linear") is False:
            return None
        recipe = value.get("recipe_name") or "tensorwise"
        if recipe not in FLOAT8_RECIPES:
            raise ConfigError(
                f"float8: recipe_name must be one of {', '.join(FLOAT8_RECIPES)}, got {recipe!r}"
            )
        gather = bool(value.get("enable_fsdp_float8_all_gather", False))
        if gather and value.get("recipe_name") is not None:
            raise ConfigError(
                "float8: enable_fsdp_float8_all_gather applies to tensorwise scaling without "
                "a recipe_name (torchtitan asserts this); drop one of them"
            )
        filters = value.get("filter_fqns") or ()
        if isinstance(filters, str):
            filters = [f.strip() for f in filters.split(",") if f.strip()]
        precompute = gather and bool(value.get("precompute_float8_dynamic_scale_for_fsdp"))
        spec = Float8(str(recipe), gather, tuple(str(f) for f in filters), precompute)
    else:
        raise ConfigError(
            "float8 must be True (tensorwise float8 linears), a dict of torchtitan's float8 "
            f"keys (enable_fsdp_float8_all_gather, recipe_name, filter_fqns) or None; got {value!r}"
        )
    if spec.enable_fsdp_float8_all_gather and api != "FSDP2":
        raise ConfigError(
            "float8: enable_fsdp_float8_all_gather needs FSDP2 (fully_shard); FSDP1 all-gathers "
            "the weights in their own dtype. Drop it, or plan with fully_shard=[...]"
        )
    return spec


def float8_weights(modules: Iterable[ModuleInfo], spec: Float8) -> set[str]:
    """FQNs of the weights that train in float8, from a report's modules, each also by the
    name its unit lists it under (without wrapper segments) where that differs."""
    found: set[str] = set()
    for m in modules:
        if m.module_class != "Linear" or "weight" not in m.params:
            continue
        shape = m.params["weight"]
        if len(shape) == 2 and spec.picks(m.fqn, shape[1], shape[0]):
            found.add(f"{m.fqn}.weight" if m.fqn else "weight")
    return found | set(param_names(found).values())


def micro_step_syncs(grad_accum: int) -> list[bool]:
    """Whether each iteration a prediction holds reduces its gradients: two optimizer steps
    (the first, and one in the steady state) of ``grad_accum`` micro-steps each, the last
    micro-step of each synchronised; two synchronised iterations without accumulation."""
    if grad_accum <= 1:
        return [True, True]
    return [i % grad_accum == grad_accum - 1 for i in range(2 * grad_accum)]
