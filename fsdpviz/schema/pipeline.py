"""``Report.pipeline``: FSDP2 inside pipeline parallelism (``torch.distributed.pipelining``).

A job on a mesh with a ``pp`` dimension splits the model into stages (each a model part
that ``fully_shard`` makes an FSDP root of its own, as torchtitan applies it), places them
on the pipeline ranks (one each for ``GPipe`` and ``1F1B``, several for the multi-stage
schedules: ``stage % pp`` for looped placement, a V for ``ZBVZeroBubble`` and
``DualPipeV``), and runs each rank's actions in the order the schedule gives:

``schedule``, ``microbatches``, ``pp_size``
    The schedule as ``get_schedule_class`` names it (``"1F1B"``, ``"Interleaved1F1B"``,
    ...; a CSV schedule its file name), the microbatches of a step, the pipeline ranks.
``stages``
    One :class:`Stage` per stage, in order: its index, the pipeline rank that runs it, the
    module FQNs it holds (torchtitan's ``module_fqns_per_model_part``) and its units.
``actions``
    Pipeline rank -> its actions of one step in the order torch's runtime runs them, as
    torch writes them: ``0F1`` (stage 0's forward of microbatch 1), ``2B0`` (full backward),
    ``1I0`` / ``1W0`` (input and weight backward), ``0UNSHARD`` / ``0RESHARD`` (FSDP's
    all-gather / free of a whole stage), ``0REDUCE_GRAD`` (its reduce-scatters), and the
    sends and receives ``0SEND_F1``, ``1RECV_F1``, ``1SEND_B0``, ``0RECV_B0``.
``ranks``
    A prediction's full :class:`~fsdpviz.schema.report.Report` of each pipeline rank: its
    units, its events in order (each FSDP event with the ``stage``, ``microbatch`` and
    ``action`` that issued it, and the ``pp_send`` / ``pp_recv`` events), its memory and
    time. A recording is one rank's report: ``rank`` says which, ``ranks`` is empty.

Every stage's model part has the model's root as its root (FQN ``""``): the unit (and
the hooks) of a stage's root are named ``(root of stage 3)`` (:func:`stage_root`), so the
roots of a rank's or the job's stages stay apart.

The first step differs from the steady one: ``PipelineStage`` infers the shapes of each
stage's inputs and outputs by running its forward (and its backward to its inputs) once
before the first action; those events have a ``stage`` and no ``action``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from fsdpviz.schema.serial import OMIT_NONE, Record, each, key, record_dict, record_from


class _Serialisable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=_Serialisable)  # a pipeline rank's report: Report (schema/report.py)

SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")


def stage_root(index: int) -> str:
    """The name of stage ``index``'s root unit: ``"(root of stage 3)"``."""
    return f"(root of stage {index})"


_INT = key(read=int)
_LIST = key(read=list)


@dataclass(frozen=True)
class Stage(Record):
    """One pipeline stage: a model part on one pipeline rank."""

    index: int = field(metadata=_INT)
    rank: int = field(metadata=_INT)
    modules: list[str] = field(metadata=_LIST)
    units: list[str] = field(default_factory=list, metadata=_LIST)


@dataclass
class Pipeline(Generic[R]):
    """The pipeline a report's FSDP runs in; see the module docstring. ``Report.pipeline``
    is a ``Pipeline[Report]``: ``ranks`` holds reports.

    Example::

        report = fsdpviz.analyze(model, ids, fully_shard=[Block], mesh=("pp", 2, "dp_shard", 4),
                                 pipeline_schedule="Interleaved1F1B", microbatches=4)
        report.pipeline.actions[1][:4]        # ['1UNSHARD', '3UNSHARD', '1F0', ...]
        report.pipeline.ranks[1].iterations[1][0].describe()
    """

    schedule: str = field(metadata=key(read=str))
    microbatches: int = field(metadata=_INT)
    pp_size: int = field(metadata=_INT)
    stages: list[Stage] = field(metadata=key(read=each(Stage.from_dict)))
    actions: dict[int, list[str]] = field(
        default_factory=dict,
        metadata=key(
            write=lambda actions: {str(r): list(a) for r, a in actions.items()},
            read=lambda actions: {int(r): list(a) for r, a in actions.items()},
        ),
    )
    rank: int | None = field(default=None, metadata=OMIT_NONE)  # a recording's pipeline rank
    ranks: list[R] = field(
        default_factory=list,
        metadata=key(omit="empty", write=lambda ranks: [r.to_dict() for r in ranks]),
    )
    # a pipeline rank's report of a prediction: the job's report it is one rank of (what its
    # time model needs: every rank's sends); not written to JSON
    job: Any = field(default=None, repr=False, compare=False, metadata=key(saved=False))
    # the job's: what the cost model worked out for it (every rank's timeline, by options)
    cache: dict[Any, Any] = field(
        default_factory=dict, repr=False, compare=False, metadata=key(saved=False)
    )

    @property
    def stages_per_rank(self) -> int:
        return len(self.stages) // self.pp_size

    def stages_of(self, rank: int) -> list[Stage]:
        """The stages pipeline rank ``rank`` runs, in stage order."""
        return [s for s in self.stages if s.rank == rank]

    def stage_of_unit(self, unit: str) -> Stage | None:
        """The stage holding unit ``unit`` (None for a name no stage has)."""
        for s in self.stages:
            if unit in s.units:
                return s
        return None

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], ranks: list[R]) -> Pipeline[R]:
        """Read :meth:`to_dict`'s output; ``ranks``: its ``"ranks"`` read as reports."""
        return record_from(cls, d, ranks=ranks)
