"""The FSDP options that the command line, the explorer's re-plan controls, the re-planner
and :func:`fsdpviz.tune` share, typed once: one :class:`OptionSpec` per option
(:data:`FSDP_OPTIONS`), which says which API takes it, the values it takes, its flag and
help line, its control's label, and how generated code writes it.

Values are stored as fsdpviz stores them in ``Report.config``: an enum option by its
member's name (``"BACKWARD_PRE"``), ``None`` as ``None``. The torch enum a name stands for
is looked up where torch is loaded (:func:`fsdpviz.plan.fsdp1_options.enum_value`); this
module imports no torch, so the command line checks its flags before torch is loaded.

Example::

    spec = OPTIONS["backward_prefetch"]
    spec.flag, spec.word("BACKWARD_POST"), spec.code("BACKWARD_POST")
    # ('--backward-prefetch', 'post', 'backward_prefetch=BackwardPrefetch.BACKWARD_POST')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = ["FSDP_OPTIONS", "OPTIONS", "RESHARD", "RESHARD_KEYWORD", "OptionSpec", "options_of"]

Api = Literal["FSDP1", "FSDP2"]
ValueKind = Literal["int", "bool", "enum", "reshard"]


@dataclass(frozen=True, kw_only=True)
class OptionSpec:
    """One FSDP option as every front end of fsdpviz offers it.

    Attributes:
        name: the keyword, as ``FullyShardedDataParallel`` / ``fully_shard`` and
            :func:`fsdpviz.analyze` take it (``"backward_prefetch"``).
        apis: the APIs that take it (``("FSDP1",)``; ``world_size`` both).
        kind: ``"int"``, ``"bool"``, ``"enum"`` (``enum``'s members, by name) or
            ``"reshard"`` (FSDP2's ``True``, ``False`` or a number of ranks).
        enum: the torch enum an ``"enum"`` option takes (``"BackwardPrefetch"``, in
            ``torch.distributed.fsdp``).
        default: the default as fsdpviz stores it (``"BACKWARD_PRE"``).
        words: the command line's words for an ``"enum"`` option, in the order ``--help``
            lists them, and the stored value each stands for (``{"pre": "BACKWARD_PRE",
            ..., "none": None}``); its values are the choices the controls offer.
        flag: the command-line flag (``"--backward-prefetch"``); a ``"bool"`` option's is a
            switch that sets it ``True``.
        help: the flag's help line.
        metavar: the flag's metavar (``None``: argparse's).
        label: the explorer's control for it (``None``: no control).
        tooltip: that control's tooltip.
        knob: what :func:`fsdpviz.tune` calls the knob that turns it (``None``: no knob
            of its own).
        instead: what the other API does instead, for the command line's refusal of an
            option of one API given while planning the other.
        summary: its line in ``%fsdpviz``'s list of options (after the flag and its
            values; :meth:`summary_line`).
        trainer_keys: the key each trainer's config file gives it, by trainer
            (``"accelerate"``: its ``fsdp_config``, ``"torchtitan"``: its
            ``[parallelism]``), where fsdpviz reads that trainer's files
            (:mod:`fsdpviz.configs`) and :func:`fsdpviz.tune` writes them.
    """

    name: str
    apis: tuple[Api, ...]
    kind: ValueKind
    enum: str | None = None
    default: Any = None
    words: Mapping[str, str | None] = field(default_factory=dict)
    flag: str | None = None
    help: str = ""
    metavar: str | None = None
    label: str | None = None
    tooltip: str = ""
    knob: str | None = None
    instead: str = ""
    summary: str = ""
    trainer_keys: Mapping[str, str] = field(default_factory=dict)

    @property
    def choices(self) -> tuple[str | None, ...]:
        """An ``"enum"`` option's values as fsdpviz stores them, in the flag's order."""
        return tuple(self.words.values())

    @property
    def dest(self) -> str:
        """The ``argparse`` attribute of its flag (the option's name)."""
        assert self.flag is not None
        return self.flag.removeprefix("--").replace("-", "_")

    def stored(self, word: str) -> str | None:
        """The flag's ``word`` as the value fsdpviz stores (``"post"`` -> ``"BACKWARD_POST"``)."""
        return self.words[word]

    def word(self, value: Any) -> str:
        """A stored value as the flag's word (a value without one as itself)."""
        return next((k for k, v in self.words.items() if v == value), str(value))

    def summary_line(self) -> str:
        """Its line in ``%fsdpviz``'s list of options: the flag and the values it takes,
        then :attr:`summary` in the list's columns
        (``"  --world-size N              ranks (default 8)"``)."""
        assert self.flag is not None
        takes = "|".join(self.words) if self.kind == "enum" else self.metavar
        left = f"  {self.flag} {takes}" if takes else f"  {self.flag}"
        column = 30 if len(left) < 30 else 42 if len(left) < 42 else len(left) + 4
        return f"{left.ljust(column)}{self.summary}"

    def code(self, value: Any) -> str:
        """The keyword argument as Python code writes it
        (``sharding_strategy=ShardingStrategy.SHARD_GRAD_OP``, ``forward_prefetch=True``)."""
        if self.enum is not None and value is not None:
            return f"{self.name}={self.enum}.{value}"
        return f"{self.name}={value!r}"


RESHARD_KEYWORD: Final = "reshard_after_forward"
"""The keyword of FSDP2's resharding option (:data:`RESHARD`'s name) as its literal type: a
typed dict of keywords (``FSDPKwargs``) takes it as a key, and type checkers check the value
it is given against the key's type."""

FSDP_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec(
        name=RESHARD_KEYWORD,
        apis=("FSDP2",),
        kind="reshard",
        default=True,
        flag="--reshard-after-forward",
        help="FSDP2 reshard_after_forward (default: torch's: True, the root False)",
        metavar="true|false|N",
        label="reshard_after_forward",
        tooltip="FSDP2: free after forward (True), keep (False), or reshard to N ranks",
        knob="resharding",
        instead="--sharding-strategy grad_op (FSDP1's way to keep parameters after forward)",
        summary="FSDP2 reshard_after_forward",
        trainer_keys={
            "accelerate": "fsdp_reshard_after_forward",
            "torchtitan": "fsdp_reshard_after_forward",
        },
    ),
    OptionSpec(
        name="backward_prefetch",
        apis=("FSDP1",),
        kind="enum",
        enum="BackwardPrefetch",
        default="BACKWARD_PRE",
        words={"pre": "BACKWARD_PRE", "post": "BACKWARD_POST", "none": None},
        flag="--backward-prefetch",
        help="FSDP1 BackwardPrefetch (FSDP's default: pre)",
        label="backward prefetch",
        knob="backward prefetch",
        summary="FSDP1",
    ),
    OptionSpec(
        name="forward_prefetch",
        apis=("FSDP1",),
        kind="bool",
        default=False,
        flag="--forward-prefetch",
        help="FSDP1 forward_prefetch=True",
        label="forward prefetch",
        knob="forward prefetch",
        summary="FSDP1 forward_prefetch=True",
    ),
    OptionSpec(
        name="sharding_strategy",
        apis=("FSDP1",),
        kind="enum",
        enum="ShardingStrategy",
        default="FULL_SHARD",
        words={
            "full": "FULL_SHARD",
            "grad_op": "SHARD_GRAD_OP",
            "no_shard": "NO_SHARD",
            "hybrid": "HYBRID_SHARD",
        },
        flag="--sharding-strategy",
        help="FSDP1 ShardingStrategy (default: full)",
        label="sharding",
        summary="FSDP1",
    ),
    OptionSpec(
        name="use_orig_params",
        apis=("FSDP1",),
        kind="bool",
        default=False,
        flag="--use-orig-params",
        help="FSDP1 use_orig_params=True",
        summary="FSDP1 use_orig_params=True",
    ),
    OptionSpec(
        name="world_size",
        apis=("FSDP1", "FSDP2"),
        kind="int",
        default=8,
        flag="--world-size",
        help="ranks (default: the config file's, else 8)",
        metavar="N",
        label="world size",
        summary="ranks (default 8)",
    ),
)
"""Every shared FSDP option, in the order the command line's ``--help`` lists their flags."""

OPTIONS: Mapping[str, OptionSpec] = {spec.name: spec for spec in FSDP_OPTIONS}
""":data:`FSDP_OPTIONS` by name."""

RESHARD: OptionSpec = OPTIONS[RESHARD_KEYWORD]
"""FSDP2's option to free, keep or reshard to fewer ranks a group's parameters after forward:
where messages, generated code and the tuner's knobs read its keyword (:attr:`OptionSpec.name`,
:meth:`OptionSpec.code`)."""


def options_of(api: Api) -> tuple[OptionSpec, ...]:
    """The options of :data:`FSDP_OPTIONS` that ``api`` alone takes, in their order."""
    return tuple(spec for spec in FSDP_OPTIONS if spec.apis == (api,))
