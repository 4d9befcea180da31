"""Re-planning one traced model under other FSDP options: the interface the explorer's controls use.

:class:`Replanner` holds a model and its inputs; :meth:`Replanner.plan` takes a
:class:`PlanOptions` (or its fields as keywords) and returns a :class:`Report`,
by the fastest exact path (``last_path`` says which):

- ``"cache"``: these options were planned before;
- ``"replay"``: only the world size, backward prefetch or sharding strategy differ
  from a report that carries a trace profile: its hook calls are replayed
  (:func:`fsdpviz.replan.replay`), profile included;
- ``"stored trace"``: plans come from one stored trace of the model per recipe
  (:class:`fsdpviz.replan.stored_fsdp1.StoredTrace`,
  :class:`fsdpviz.replan.stored_fsdp2.StoredTrace`, made on the recipe's first plan):
  a new policy, prefetch or recipe costs tens of milliseconds; the report has no trace
  profile (the memory model then knows parameters and gradients, not activations),
  which :meth:`Replanner.profiled` adds by tracing;
- ``"trace"``: :func:`fsdpviz.analyze` (what the stored traces do not model: mixed
  precision, recomputation, FSDP1 with frozen parameters, ...).

Example::

    planner = Replanner(model, {"input_ids": ids})
    planner.layer_classes()                  # [('DecoderLayer', 32), ('Attention', 32), ...]
    report = planner.plan(layer_classes=["DecoderLayer"], world_size=64,
                          backward_prefetch="BACKWARD_POST")
    planner.last_seconds, planner.last_path  # (0.04, 'stored trace')
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack, cast

from torch import nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

from fsdpviz._deferred_gc import answering
from fsdpviz.api.keywords import AnalyzeKwargs
from fsdpviz.api.predict import analyze
from fsdpviz.cost.fit import check_fit, machine_spec
from fsdpviz.errors import ConfigError
from fsdpviz.plan.fsdp1_options import enum_value
from fsdpviz.plan.option_specs import FSDP_OPTIONS, OPTIONS, RESHARD, Api, OptionSpec, options_of
from fsdpviz.plan.options import DEFAULT_WORLD_SIZE
from fsdpviz.replan.hook_replay import REPLAYABLE, replay
from fsdpviz.replan.stored_fsdp1 import StoredTrace as StoredTrace1
from fsdpviz.replan.stored_fsdp2 import StoredTrace as StoredTrace2
from fsdpviz.schema.keywords import PlanKwargs
from fsdpviz.schema.report import Report
from fsdpviz.trace.copy import check_model

__all__ = [
    "BACKWARD_PREFETCH",
    "SHARDING_STRATEGIES",
    "PlanOptions",
    "Recipe",
    "Replanner",
]

Recipe = Literal["FSDP1", "FSDP2"]
PlanPath = Literal["cache", "replay", "stored trace", "trace"]
PolicyKind = Literal["classes", "size", "none"]
SHARDING_STRATEGIES: tuple[str, ...] = tuple(str(v) for v in OPTIONS["sharding_strategy"].choices)
BACKWARD_PREFETCH = OPTIONS["backward_prefetch"].choices


@dataclass(frozen=True)
class PlanOptions:
    """What the explorer's controls choose. Hashable, so plans can be cached.

    ``policy``: ``"classes"`` wraps every instance of ``layer_classes`` (names as
    :meth:`Replanner.layer_classes` lists them; ``ModuleWrapPolicy``), ``"size"`` wraps
    subtrees of at least ``min_num_params`` parameters (``size_based_auto_wrap_policy``),
    ``"none"`` wraps only the root. ``recipe="FSDP2"`` applies ``fully_shard`` to the same
    modules instead, with ``reshard_after_forward`` (``True``, ``False`` or the number of
    ranks to reshard to); ``sharding_strategy`` and the prefetch switches are FSDP1's.
    """

    policy: PolicyKind = "classes"
    layer_classes: tuple[str, ...] = ()
    min_num_params: int = 100_000_000
    world_size: int = DEFAULT_WORLD_SIZE
    sharding_strategy: str = OPTIONS["sharding_strategy"].default
    backward_prefetch: str | None = OPTIONS["backward_prefetch"].default
    forward_prefetch: bool = OPTIONS["forward_prefetch"].default
    recipe: Recipe = "FSDP1"
    reshard_after_forward: bool | int = RESHARD.default

    def replace(self, **changes: Unpack[PlanChanges]) -> PlanOptions:
        """A copy with ``changes`` (``layer_classes`` may be any sequence)."""
        fields: dict[str, Any] = dict(changes)
        if "layer_classes" in fields:
            fields["layer_classes"] = tuple(fields["layer_classes"])
        return dataclasses.replace(self, **fields)

    @classmethod
    def from_report(cls, report: Report) -> PlanOptions:
        """The options a report was made with, as far as its ``config`` says."""
        cfg = report.config
        classes = tuple(sorted({u.module_class for u in report.units if u.module != ""}))
        fsdp1 = {s.name: getattr(cfg, s.name) for s in _planned("FSDP1")}
        fsdp2 = {}  # FSDP2's options are per group: the groups' most common value
        for spec in _planned("FSDP2"):
            values = Counter(v for unit, v in getattr(cfg, spec.name).items() if unit != "")
            fsdp2[spec.name] = values.most_common(1)[0][0] if values else spec.default
        return cls(
            policy="classes" if classes else "none",
            layer_classes=classes,
            world_size=cfg.ranks,
            recipe=cfg.api,
            **fsdp1,
            **fsdp2,
        )


class PlanChanges(TypedDict, total=False):
    """:class:`PlanOptions`' fields by name, as :meth:`Replanner.plan` and the controls'
    ``set`` take them (``layer_classes`` any sequence)."""

    policy: PolicyKind
    layer_classes: Sequence[str]
    min_num_params: int
    world_size: int
    sharding_strategy: str
    backward_prefetch: str | None
    forward_prefetch: bool
    recipe: Recipe
    reshard_after_forward: bool | int


def _planned(api: Api) -> tuple[OptionSpec, ...]:
    """The options of the table (:mod:`fsdpviz.plan.option_specs`) that ``api`` alone takes
    and :class:`PlanOptions` chooses."""
    return tuple(s for s in options_of(api) if s.name in _FIELDS)


_FIELDS = frozenset(f.name for f in dataclasses.fields(PlanOptions))


def _replayable(recipe: Recipe) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The :class:`PlanOptions` fields :func:`fsdpviz.replan.replay` can change without a
    new trace under ``recipe``, and the analyze keyword arguments they become (the options
    ``recipe`` takes that ``REPLAYABLE`` lists). The FSDP2 recipe ignores FSDP1's options."""
    keys = tuple(
        s.name
        for s in FSDP_OPTIONS
        if s.name in _FIELDS and recipe in s.apis and s.name in REPLAYABLE[recipe]
    )
    ignored = tuple(s.name for s in _planned("FSDP1")) if recipe == "FSDP2" else ()
    return keys + ignored, keys


class Replanner:
    """Plans ``model`` on ``inputs`` under any :class:`PlanOptions`; see the module docstring.

    ``analyze_kwargs`` are passed to every :func:`fsdpviz.analyze` call (``loss``,
    ``trace``, ``mixed_precision``, ``use_orig_params``, ...). ``cache_size`` plans are kept.
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: Any,
        *,
        cache_size: int = 16,
        **analyze_kwargs: Unpack[AnalyzeKwargs],
    ) -> None:
        check_model(model, "Replanner")
        self.model = model
        self.inputs = inputs
        self.analyze_kwargs: AnalyzeKwargs = {"progress": False, **analyze_kwargs}
        self.cache_size = cache_size
        self.last_seconds: float | None = None
        self.last_cached = False
        self.last_path: PlanPath | None = None
        self._cache: OrderedDict[PlanOptions, Report] = OrderedDict()
        # per recipe; None when its stored trace cannot answer (plans then trace)
        self._stored: dict[Recipe, StoredTrace1 | StoredTrace2 | None] = {}
        self._classes: dict[str, type[nn.Module]] = {}
        counts: Counter[str] = Counter()
        for module in model.modules():
            cls = type(module)
            name = self._class_name(cls)
            self._classes.setdefault(name, cls)
            counts[name] += 1
        self._counts = counts
        self._root_class = self._class_name(type(model))

    def _class_name(self, cls: type[nn.Module]) -> str:
        name = cls.__name__
        other = self._classes.get(name)
        if other is None or other is cls:
            return name
        return f"{cls.__module__}.{cls.__qualname__}"

    def layer_classes(self) -> list[tuple[str, int]]:
        """``(class name, instances)`` of the model's module classes, most frequent first.

        The root's class and classes without parameters anywhere below them are left out.
        """
        with_params = {
            self._class_name(type(m))
            for m in self.model.modules()
            if next(m.parameters(), None) is not None
        }
        out = [
            (name, n)
            for name, n in self._counts.items()
            if name != self._root_class and name in with_params
        ]
        return sorted(out, key=lambda t: (-t[1], t[0]))

    def plan(self, options: PlanOptions | None = None, **changes: Unpack[PlanChanges]) -> Report:
        """The report for ``options`` (default :class:`PlanOptions`) with ``changes`` applied."""
        opts = (
            (options or PlanOptions()).replace(**changes) if changes else (options or PlanOptions())
        )
        cached = self._cache.get(opts)
        if cached is not None:
            self._cache.move_to_end(opts)
            self.last_seconds, self.last_cached, self.last_path = 0.0, True, "cache"
            return cached
        start = time.perf_counter()
        stored = self._stored_trace(opts)
        with answering():  # no garbage-collector pause inside a fast answer
            fast = self._replay(opts) or (self._from_stored(stored, opts) if stored else None)
        report, path = fast or (self._analyze(opts), "trace")
        self.last_seconds, self.last_cached = time.perf_counter() - start, False
        self.last_path = path
        self.remember(opts, report)
        return report

    def warm(self, options: PlanOptions) -> None:
        """Make the stored trace ``options`` would re-plan from now (its recipe's first
        plan otherwise makes it), so later plans answer in tens of milliseconds."""
        self._stored_trace(options)

    def has_stored_trace(self, options: PlanOptions) -> bool:
        """Whether the stored trace of ``options``' recipe was made (or found unusable)."""
        return options.recipe in self._stored

    def cached(self, options: PlanOptions) -> Report | None:
        """The report planned for ``options`` if it is still in the cache."""
        return self._cache.get(options)

    def profiled(self, options: PlanOptions) -> Report:
        """The report for ``options`` with its trace profile (traces when the plan had none)."""
        report = self.plan(options)
        if report.profile is not None or report.source != "prediction":
            return report
        start = time.perf_counter()
        report = self._analyze(options)
        self.last_seconds, self.last_cached = time.perf_counter() - start, False
        self.last_path = "trace"
        self.remember(options, report)
        return report

    def remember(self, opts: PlanOptions, report: Report) -> None:
        """Keep ``report`` as the plan for ``opts`` (e.g. the report a view was opened with:
        a later world-size, sharding or prefetch change then replays it, profile included)."""
        self._cache[opts] = report
        self._cache.move_to_end(opts)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _replay(self, opts: PlanOptions) -> tuple[Report, PlanPath] | None:
        """Replay a profiled report that differs only in what replays exactly."""
        fields, keys = _replayable(opts.recipe)
        for other, report in reversed(self._cache.items()):
            if report.profile is None or report.config.replayed:
                continue
            if dataclasses.replace(other, **{k: getattr(opts, k) for k in fields}) != opts:
                continue
            kw: Mapping[str, object] = self.fsdp_kwargs(opts)
            before: Mapping[str, object] = self.fsdp_kwargs(other)
            changes = cast(PlanKwargs, {k: kw[k] for k in keys if kw.get(k) != before.get(k)})
            if report.config.tp_world_size and {"world_size", "mesh"} & set(changes):
                continue  # a tp plan's new world size does not say its mesh: traced again
            return replay(report, **changes), "replay"
        return None

    def _stored_trace(self, opts: PlanOptions) -> StoredTrace1 | StoredTrace2 | None:
        """The stored trace the recipe's plans come from (made now if this is the first)."""
        kwargs = self.fsdp_kwargs(opts)
        refused = (
            "mixed_precision", "ignored_modules", "ignored_states", "mp_policy", "parallelize_plan",
        )  # fmt: skip
        if any(k in kwargs for k in refused) or kwargs.get("trace", "meta") != "meta":
            return None
        if opts.recipe not in self._stored:
            make = StoredTrace1 if opts.recipe == "FSDP1" else StoredTrace2
            stored = make(self.model, self.inputs, kwargs.get("loss"))
            self._stored[opts.recipe] = None if stored.reason is not None else stored
        return self._stored[opts.recipe]

    def _from_stored(
        self, stored: StoredTrace1 | StoredTrace2, opts: PlanOptions
    ) -> tuple[Report, PlanPath] | None:
        kwargs = self.fsdp_kwargs(opts)
        kwargs.pop("profile", None)
        machine = kwargs.pop("machine", None)  # analyze's, not an FSDP option
        report = stored.plan(**cast(PlanKwargs, kwargs))  # machine and profile taken out
        if report is None:
            return None
        if machine is not None:
            report.config = report.config.replace(machine=machine_spec(machine))
        check_fit(report)
        return report, "stored trace"

    def fsdp_kwargs(self, opts: PlanOptions) -> AnalyzeKwargs:
        """The :func:`fsdpviz.analyze` keyword arguments for ``opts``: the recipe's options of
        the table (:mod:`fsdpviz.plan.option_specs`) as FSDP takes them, and its wrapping.

        FSDP2 calls ``fully_shard`` on every instance of the layer classes, then the root;
        it prefetches implicitly (explicit maps are ``analyze`` options) and has no sharding
        strategy, so those FSDP1 options do not apply; ``reshard_after_forward`` goes to
        every ``fully_shard`` call as it is.
        """
        if opts.sharding_strategy not in SHARDING_STRATEGIES:
            raise ConfigError(
                f"unknown sharding strategy {opts.sharding_strategy!r}; "
                f"use one of {', '.join(SHARDING_STRATEGIES)}"
            )
        kwargs: dict[str, Any] = {**self.analyze_kwargs, "world_size": opts.world_size}
        if opts.recipe == "FSDP2":
            if opts.policy == "size":
                raise ConfigError("the FSDP2 recipe takes layer classes, not a size threshold")
            classes = sorted(self._resolve(opts.layer_classes), key=lambda c: c.__name__)
            kwargs["fully_shard"] = classes if opts.policy == "classes" else []
        kwargs.update({s.name: enum_value(s, getattr(opts, s.name)) for s in _planned(opts.recipe)})
        if opts.recipe == "FSDP1" and opts.policy == "classes":
            kwargs["auto_wrap_policy"] = ModuleWrapPolicy(self._resolve(opts.layer_classes))
        elif opts.recipe == "FSDP1" and opts.policy == "size":
            kwargs["auto_wrap_policy"] = functools.partial(
                size_based_auto_wrap_policy, min_num_params=int(opts.min_num_params)
            )
        return cast(AnalyzeKwargs, kwargs)

    def _resolve(self, names: Sequence[str]) -> set[type[nn.Module]]:
        unknown = [n for n in names if n not in self._classes]
        if unknown:
            known = ", ".join(name for name, _ in self.layer_classes()[:10])
            raise ConfigError(f"no module class {unknown[0]!r} in the model; classes: {known}")
        return {self._classes[n] for n in names}

    def _analyze(self, opts: PlanOptions) -> Report:
        """The engine call; a faster path plugs in here."""
        return analyze(self.model, self.inputs, **self.fsdp_kwargs(opts))
