"""FSDP options written as command-line flags, shared by ``fsdpviz report``, ``fsdpviz doctor``
and ``%fsdpviz``: one table of flags (:data:`FLAGS`), from which each command's parser is
made, the flags that do not apply to a model source are refused (:func:`check_applies`)
and fsdpviz's own advice is written as flags (:func:`flags_for`).

:func:`add_fsdp_flags` adds the FSDP and job flags to an ``argparse`` parser,
:func:`add_source_flags` the flags that build a Hugging Face model by id (``hf:ID``);
:func:`check_flags` checks what they say before any model is built. The parsed flags become
:func:`fsdpviz.analyze` keyword arguments for a model in ``_options_kwargs.py``
(``analyze_kwargs``), and ``fsdpviz tune``'s own flags and its path to :func:`fsdpviz.tune`
are in ``_options_tune.py``; both raise :class:`UsageError` with what was wrong and what to
write instead.

FSDP1 (``FullyShardedDataParallel``): ``--policy``, ``--backward-prefetch``,
``--forward-prefetch``, ``--sharding-strategy``, ``--use-orig-params``. FSDP2
(``fully_shard``): ``--fully-shard`` and ``--reshard-after-forward``. Both:
``--mixed-precision``, ``--cpu-offload``, ``--world-size``, ``--machine``, ``--trace``, and
the job around FSDP (:mod:`fsdpviz.plan.job`): ``--activation-checkpointing``,
``--grad-accum``, ``--compile``, ``--float8``, ``--float32-matmul-precision``. Or a trainer's
configuration: ``--accelerate-config`` / ``--torchtitan-config`` (then the FSDP flags are
refused; the job flags override the file's). ``hf:`` models: ``--set``, ``--batch``,
``--seq``, ``--dtype``.

Importing this module imports no torch: a command parses and checks its flags first, and
loads torch (seconds) only for a command line that can run.
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fsdpviz.errors import did_you_mean
from fsdpviz.plan.job import FLOAT8_RECIPES, FLOAT32_MATMUL_PRECISIONS
from fsdpviz.plan.option_specs import OPTIONS, OptionSpec, options_of
from fsdpviz.schema.config import TRACE_MODES

__all__ = [
    "FLAGS",
    "Flag",
    "UsageError",
    "add_fsdp_flags",
    "add_source_flags",
    "check_applies",
    "flags_for",
]


_DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}


_FSDP1_ONLY = {spec.dest: spec.flag for spec in options_of("FSDP1") if spec.flag}


Source = Literal["hf", "factory", "torchtitan", "saved"]
"""Where a command's model comes from: ``hf:ID`` (built from its config), ``MODULE:FACTORY``
(the user's code builds the model and its inputs), ``--torchtitan-config`` (the file's model
and batch), or a saved report / recording (written as it was saved: nothing is planned)."""


_PLANNED: frozenset[Source] = frozenset({"hf", "factory", "torchtitan"})


class UsageError(Exception):
    """A mistake in the flags: reported as a short message (exit status 2 on the command line)."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _grad_accum(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive int (micro-steps per optimizer step), got {text!r}"
        )
    return value


def _precision(text: str) -> str:
    value = text.strip().lower()
    if value in FLOAT32_MATMUL_PRECISIONS:
        return value
    tip = did_you_mean(value, FLOAT32_MATMUL_PRECISIONS)
    raise argparse.ArgumentTypeError(
        f"must be one of {', '.join(FLOAT32_MATMUL_PRECISIONS)} (as "
        f"torch.set_float32_matmul_precision takes it), got {text!r}{tip}"
    )


def _reshard(text: str) -> bool | int:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return positive_int(low)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected true, false or a number of ranks, got {text!r}"
        ) from None


def gpu_names() -> list[str]:
    """The GPU presets ``--machine`` takes (:mod:`fsdpviz.cost.hardware`; no torch)."""
    from fsdpviz.cost.hardware import GPUS  # lazy: numpy (0.2 s), which most flags do without

    return sorted(GPUS)


def _machine(text: str) -> str:
    names = gpu_names()
    value = text.strip().lower()
    if value in names:
        return value
    tip = did_you_mean(value, names)
    raise argparse.ArgumentTypeError(f"unknown GPU {text!r}{tip} (one of {', '.join(names)})")


@dataclass(frozen=True)
class Flag:
    """One flag of :data:`FLAGS`: how ``argparse`` reads it, the :func:`fsdpviz.analyze`
    option it sets (what :func:`flags_for` writes advice with), and the model sources it
    applies to (:func:`check_applies`).

    Attributes:
        name: the flag (``"--world-size"``).
        help: its help line.
        group: ``"fsdp"``, ``"job"`` (:func:`add_fsdp_flags`) or ``"source"``
            (:func:`add_source_flags`).
        metavar, type, choices, default: as ``add_argument`` takes them; ``nargs="?"``
            with ``const=True`` for ``optional``, ``store_true`` for ``switch``, ``append``
            for ``append``.
        option: the analyze keyword it sets, for advice; ``None`` for none.
        sources: where it applies; given anywhere else, it is refused.
        why: where it applies, for the refusal (``"Hugging Face models built from their
            config (hf:ID)"``).
    """

    name: str
    help: str
    group: Literal["fsdp", "job", "source"] = "fsdp"
    kind: Literal["value", "switch", "optional", "append"] = "value"
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    default: Any = None
    option: str | None = None
    sources: frozenset[Source] = field(default=_PLANNED)
    why: str = "a model to plan"

    @classmethod
    def of(cls, spec: OptionSpec) -> Flag:
        """The flag of a shared FSDP option (:mod:`fsdpviz.plan.option_specs`): its name,
        help and metavar from the table, a switch for a bool, the words of an enum as its
        choices, a checked number for an int or FSDP2's resharding."""
        assert spec.flag is not None
        if spec.kind == "bool":
            return cls(spec.flag, spec.help, kind="switch", option=spec.name)
        if spec.kind == "enum":
            return cls(spec.flag, spec.help, choices=list(spec.words), option=spec.name)
        parse = positive_int if spec.kind == "int" else _reshard
        return cls(spec.flag, spec.help, metavar=spec.metavar, type=parse, option=spec.name)

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        kw: dict[str, Any] = {"help": self.help, "dest": self.dest}
        if self.kind == "switch":
            kw["action"] = "store_true"
        else:
            kw.update(metavar=self.metavar, default=self.default)
            if self.kind == "optional":
                kw.update(nargs="?", const=True)
            if self.kind == "append":
                kw.update(action="append", default=[])
            if self.type is not None:
                kw["type"] = self.type
            if self.choices is not None:
                kw["choices"] = list(self.choices)
        parser.add_argument(self.name, **kw)

    def given(self, args: argparse.Namespace) -> bool:
        """Whether the command line gave this flag."""
        value = getattr(args, self.dest, None)
        return value not in (None, False, [], self.default) or (
            self.kind == "switch" and bool(value)
        )


_HF: frozenset[Source] = frozenset({"hf"})


_HF_WHY = "Hugging Face models built from their config (hf:ID)"


FLAGS: tuple[Flag, ...] = (
    Flag("--policy", "FSDP1 auto_wrap_policy: transformer:Class[,Class] (ModuleWrapPolicy of "
         "the model's classes with these names), size:N (size_based_auto_wrap_policy, "
         "min_num_params=N) or none (default: a Hugging Face model's _no_split_modules, as "
         "accelerate's TRANSFORMER_BASED_WRAP; else the root only)",
         metavar="SPEC", option="auto_wrap_policy"),
    Flag("--accelerate-config", "plan what `accelerate launch --config_file YAML` runs "
         "(instead of FSDP flags)", metavar="YAML", sources=frozenset({"hf", "factory"}),
         why="a model given as hf:ID or MODULE:FACTORY"),
    Flag("--torchtitan-config", "plan the torchtitan job TOML: its Llama 3 model, batch and "
         "FSDP2 recipe", metavar="TOML", sources=frozenset({"torchtitan"})),
    Flag("--fully-shard", "FSDP2 instead: fully_shard on these module classes or FQNs "
         "(comma-separated), then on the root", metavar="NAMES", option="fully_shard"),
    *(Flag.of(spec) for spec in options_of("FSDP2")),
    Flag("--mixed-precision", "compute in DTYPE (bf16, fp16, fp32), reduce gradients in "
         "REDUCE (default DTYPE): MixedPrecision for FSDP1, MixedPrecisionPolicy for FSDP2",
         metavar="DTYPE[,REDUCE]", option="mixed_precision"),
    Flag("--cpu-offload", "parameters, gradients and optimizer state in host memory: FSDP1 "
         "CPUOffload(offload_params=True), FSDP2 offload_policy=CPUOffloadPolicy()",
         kind="switch", option="cpu_offload"),
    *(Flag.of(spec) for spec in options_of("FSDP1")),
    Flag.of(OPTIONS["world_size"]),
    Flag("--machine", "the GPU the plan is for, whose memory it must fit and whose speed the "
         "step time models: h100 (default), h200, a100, a100-40gb, ... (every preset: "
         "fsdpviz.cost.GPUS)", metavar="GPU", type=_machine, option="machine"),
    Flag("--trace", "run the model on the meta device (default) or, for models that cannot, "
         "on a copy on its own device (real) or through torch.fx (fx: FSDP1 only, not with "
         "--fully-shard)", choices=TRACE_MODES, default="meta", option="trace"),
    Flag("--activation-checkpointing", "run these module classes (comma-separated) under "
         "activation checkpointing, as accelerate and torchtitan apply it; selective:CLASSES "
         "checkpoints per operator (torchtitan's selective_ac_option=op)", group="job",
         metavar="CLASSES", option="activation_checkpointing"),
    Flag("--grad-accum", "gradient accumulation: N micro-steps per optimizer step, the first "
         "N-1 without gradient sync (FSDP1 no_sync(), FSDP2 set_requires_gradient_sync(False)), "
         "each planned as FSDP issues it (default 1)", group="job", metavar="N",
         type=_grad_accum, option="grad_accum"),
    Flag("--compile", "the model runs under torch.compile: the whole model, or these module "
         "classes compiled one by one (comma-separated, as torchtitan compiles each block); "
         "the compute is costed as fused kernels, FSDP's schedule is unchanged", group="job",
         kind="optional", metavar="CLASSES", option="compile"),
    Flag("--float8", "float8 linears (torchao) as torchtitan trains them: tensorwise scaling, "
         "or SPEC, comma-separated: a recipe (rowwise, rowwise_with_gw_hp), all-gather "
         "(FSDP2's float8 all-gather), filter_fqns=output,router, or torchtitan's KEY=VALUE",
         group="job", kind="optional", metavar="SPEC", option="float8"),
    Flag("--float32-matmul-precision", "as torch.set_float32_matmul_precision takes it: high "
         "or medium run float32 matrix multiplies on TF32 tensor cores (default: highest, "
         "torch's)", group="job", type=_precision,
         metavar="{" + ",".join(FLOAT32_MATMUL_PRECISIONS) + "}",
         option="float32_matmul_precision"),
    Flag("--set", "hf: models: override a config field (repeatable), e.g. --set "
         "num_hidden_layers=4", group="source", kind="append", metavar="KEY=VALUE",
         sources=_HF, why=_HF_WHY),
    Flag("--batch", "hf: models: batch size (1)", group="source", metavar="N",
         type=positive_int, sources=_HF, why=_HF_WHY),
    Flag("--seq", "hf: models: tokens per sequence (default: the model's context, at most "
         "2048)", group="source", metavar="N", type=positive_int, sources=_HF, why=_HF_WHY),
    Flag("--dtype", "hf: models: parameter dtype (default float32, the master weights)",
         group="source", choices=["float32", "bfloat16", "float16"], sources=_HF, why=_HF_WHY),
)  # fmt: skip
"""Every flag that plans a model, in the order ``--help`` lists them."""


_BY_DEST = {f.dest: f for f in FLAGS}


def add_fsdp_flags(parser: argparse.ArgumentParser) -> None:
    """Add the FSDP and job flags of :data:`FLAGS` to ``parser``."""
    for flag in FLAGS:
        if flag.group in ("fsdp", "job"):
            flag.add_to(parser)


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags that build a Hugging Face model from its id (``hf:ID``)."""
    for flag in FLAGS:
        if flag.group == "source":
            flag.add_to(parser)


def given_flags(args: argparse.Namespace) -> list[Flag]:
    """The flags of :data:`FLAGS` the command line gave."""
    return [f for f in FLAGS if hasattr(args, f.dest) and f.given(args)]


def check_applies(args: argparse.Namespace, source: Source, what: str) -> None:
    """Refuse the flags given that do not apply to ``source`` (``what``: the model as the
    command line named it): a flag that would be ignored is a mistake, not a default."""
    refused = [f for f in given_flags(args) if source not in f.sources]
    if not refused:
        return
    names = ", ".join(f.name for f in refused)
    one = len(refused) == 1
    if source == "saved":
        raise UsageError(
            f"{names} {'plans' if one else 'plan'} a model, and {what!r} is read as it was "
            f"saved; leave {'it' if one else 'them'} out, or give MODEL as hf:ID or "
            "MODULE:FACTORY"
        )
    whys = " / ".join(dict.fromkeys(f.why for f in refused))
    fix = ""
    if source == "factory":
        said = f"{what} builds its own model and inputs"
        fix = ", or change the factory" if any(f.sources == _HF for f in refused) else ""
    elif source == "torchtitan":
        said = "--torchtitan-config builds its own model and batch (its model.flavor)"
    else:
        said = f"{what} is a Hugging Face model"
    raise UsageError(f"{names}: for {whys} only; {said}: leave {'it' if one else 'them'} out{fix}")


def flags_for(fix: Mapping[str, object], source: Source = "factory", api: str = "FSDP1") -> str:
    """A warning's ``fix`` (:attr:`fsdpviz.FsdpWarning.fix`) as this command line's flags:
    ``--activation-checkpointing LlamaDecoderLayer``, ``--world-size 128``; ``use_cache``,
    the model call's keyword, as ``--set use_cache=false`` for ``hf:`` models (the config's
    default) and in words for a factory's inputs."""
    parts = []
    for key, value in fix.items():
        if key == "use_cache":
            parts.append(
                f"--set use_cache={str(value).lower()}"
                if source == "hf"
                else f"use_cache={value!r} in the inputs (--inputs, or the factory's)"
            )
            continue
        flag = next((f for f in FLAGS if f.option == key), None)
        if flag is None:
            parts.append(f"{key}={value!r}")
        elif flag.kind == "switch":
            parts.append(flag.name)
        elif key in OPTIONS and OPTIONS[key].kind == "enum":
            parts.append(f"{flag.name} {OPTIONS[key].word(value)}")
        elif key == "mixed_precision":
            short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
            parts.append(f"{flag.name} {short.get(str(value), value)}")
        elif isinstance(value, bool):
            parts.append(f"{flag.name} {str(value).lower()}")
        elif isinstance(value, (list, tuple)):
            parts.append(f"{flag.name} {','.join(str(v) for v in value)}")
        else:
            parts.append(f"{flag.name} {value}")
    return " ".join(parts)


def hf_id(spec: str) -> str | None:
    """The Hugging Face id or directory in a model spec: ``hf:ID``, or a bare ``org/name``
    or a directory holding a config.json; None for anything else (``module:factory``)."""
    if spec.startswith("hf:"):
        return spec[3:]
    if ":" not in spec and (Path(spec).joinpath("config.json").is_file() or spec.count("/") == 1):
        return spec
    return None


def set_item(item: str) -> tuple[str, Any]:
    """``--set KEY=VALUE``, checked: (key, value)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set takes KEY=VALUE, got {item!r}")
    return key.strip(), _literal(text.strip())


def _literal(text: str) -> Any:
    """``4`` -> 4, ``0.5`` -> 0.5, ``true`` -> True, ``null`` -> None, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_flags(args: argparse.Namespace) -> None:
    """What the flags say, checked before any model is built (and torch is loaded): each
    flag's syntax, and flags that contradict each other (an FSDP1 flag with ``--fully-shard``,
    an FSDP flag with a config file that sets the FSDP options)."""
    mixed_precision_names(getattr(args, "mixed_precision", None))
    spec = getattr(args, "policy", None)
    if spec is not None:
        policy_spec(spec)
    checkpointed = getattr(args, "activation_checkpointing", None)
    if checkpointed is not None:
        checkpointing_spec(checkpointed)
    for item in getattr(args, "set", []):
        set_item(item)
    if getattr(args, "float8", None) is not None:
        float8_spec(args.float8)
    config = "--accelerate-config" if getattr(args, "accelerate_config", None) else None
    if getattr(args, "torchtitan_config", None):
        config = "--torchtitan-config"
    if config is not None:
        given = [flag for key, flag in _FSDP_FLAGS.items() if getattr(args, key, None)]
        if given:
            raise UsageError(
                f"{', '.join(given)} cannot be combined with {config}: the file sets the FSDP "
                "options (only --world-size and --trace can be given with it)"
            )
        return
    if getattr(args, "fully_shard", None):
        given = [flag for key, flag in _FSDP1_ONLY.items() if getattr(args, key, None)]
        if spec is not None and spec.strip().lower() != "none":
            given.insert(0, "--policy")
        if given:
            verb = "is an FSDP1 option" if len(given) == 1 else "are FSDP1 options"
            raise UsageError(
                f"{', '.join(given)} {verb}; with --fully-shard (FSDP2) leave it out, or drop "
                "--fully-shard to plan FSDP1"
            )
        if args.trace == "fx":
            raise UsageError(
                "--trace fx traces FSDP1 plans only (torch.fx symbolic tracing of the module "
                "tree); with --fully-shard (FSDP2) use --trace meta (default) or --trace real"
            )
        if not [n for n in args.fully_shard.split(",") if n.strip()]:
            raise UsageError("--fully-shard needs at least one module class or FQN")
    else:
        for spec in options_of("FSDP2"):
            if getattr(args, spec.dest, None) is not None:
                raise UsageError(
                    f"{spec.flag} is an FSDP2 option: add --fully-shard NAMES, or use "
                    f"{spec.instead}"
                )


_FLOAT8_WORDS = (*FLOAT8_RECIPES, "all_gather")


def checkpointing_spec(spec: str) -> tuple[bool, list[str]]:
    """``--activation-checkpointing``'s spec, checked: (selective, class names)."""
    kind, sep, rest = spec.partition(":")
    selective = bool(sep) and kind.strip().lower() == "selective"
    if sep and not selective:
        raise UsageError(
            f"--activation-checkpointing takes CLASSES or selective:CLASSES, got {spec!r}"
        )
    names = [n.strip() for n in (rest if selective else spec).split(",") if n.strip()]
    if not names:
        raise UsageError("--activation-checkpointing needs at least one class name")
    return selective, names


def job_flag_value(args: argparse.Namespace) -> str | None:
    """The word ``--compile`` or ``--float8`` took when the command's positional argument is
    missing (``--compile mypkg:build``: the model, not module classes): the flag is set to
    its bare form and the word returned, else None."""
    for key in ("compile", "float8"):
        value = getattr(args, key, None)
        if not isinstance(value, str):
            continue
        word = value.strip().lower().replace("-", "_")
        if key == "float8" and ("=" in value or "," in value or word in _FLOAT8_WORDS):
            continue
        setattr(args, key, True)
        return value
    return None


def float8_spec(spec: str | bool) -> bool | dict[str, Any]:
    """``--float8 SPEC``: comma-separated torchtitan float8 keys (``KEY=VALUE``; a key alone
    is ``true``), a recipe name for ``recipe_name``, ``all-gather`` for
    ``enable_fsdp_float8_all_gather``; ``filter_fqns=a,b`` takes the words after it that have
    no ``=``."""
    if spec is True or not str(spec).strip():
        return True
    out: dict[str, Any] = {}
    listing = False
    for item in (w.strip() for w in str(spec).split(",")):
        if not item:
            continue
        key, sep, value = (p.strip() for p in item.partition("="))
        word = key.lower().replace("-", "_")
        if not sep and listing and word not in _FLOAT8_WORDS:
            out["filter_fqns"].append(item)
            continue
        listing = key == "filter_fqns"
        if listing:
            out[key] = [value] if value else []
        elif not sep and word in FLOAT8_RECIPES:
            out["recipe_name"] = word
        elif not sep and word == "all_gather":
            out["enable_fsdp_float8_all_gather"] = True
        elif not sep and (close := difflib.get_close_matches(word, _FLOAT8_WORDS, n=1)):
            raise UsageError(
                f"--float8: unknown {key!r}; did you mean "
                f"{'all-gather' if close[0] == 'all_gather' else close[0]!r}? "
                f"(a recipe: {', '.join(FLOAT8_RECIPES)}; all-gather; or KEY=VALUE of "
                "torchtitan's float8 keys)"
            )
        elif not sep or value.lower() in ("true", "false"):
            out[key] = not sep or value.lower() == "true"
        else:
            out[key] = value
    return out


_FSDP_FLAGS = {
    "policy": "--policy", "fully_shard": "--fully-shard",
    **{spec.dest: spec.flag for spec in options_of("FSDP2") if spec.flag},
    "mixed_precision": "--mixed-precision",
    **_FSDP1_ONLY,
    "cpu_offload": "--cpu-offload",
}  # fmt: skip


def mixed_precision_names(spec: str | None) -> list[str]:
    """``--mixed-precision``'s dtypes, by torch's names (``["bfloat16", "float32"]``)."""
    if not spec:
        return []
    names = [n.strip().lower() for n in spec.split(",")]
    if len(names) > 2 or not all(names):
        raise UsageError(f"--mixed-precision takes DTYPE or DTYPE,REDUCE_DTYPE, got {spec!r}")
    dtypes = []
    for name in names:
        if name not in _DTYPES:
            tip = did_you_mean(name, sorted(_DTYPES))
            raise UsageError(
                f"--mixed-precision: unknown dtype {name!r}{tip} (use bf16, fp16 or fp32)"
            )
        dtypes.append(_DTYPES[name])
    return dtypes


def policy_spec(spec: str) -> tuple[str, str]:
    """``--policy``'s kind and argument, checked: ``("size", "1000")``."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "none" and not arg:
        return "none", ""
    if kind == "transformer" and arg:
        return kind, arg
    if kind == "size" and arg:
        try:
            min_num_params = int(float(arg)) if "e" in arg.lower() else int(arg)
        except ValueError:
            min_num_params = -1
        if min_num_params < 1:
            raise UsageError(f"--policy size:N needs a positive integer N, got {arg!r}")
        return kind, str(min_num_params)
    raise UsageError(
        f"--policy {spec!r} is not valid; use transformer:Class[,Class], size:N or none"
    )
