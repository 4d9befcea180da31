"""The keyword arguments of :func:`fsdpviz.analyze`, typed once, for every function that
passes them on (``compare``'s plans, re-planning, ``tune``, the widgets' constructors).

FSDP's own keywords take the types torch's ``FullyShardedDataParallel`` (FSDP1) and
``fully_shard`` (FSDP2) take, plus the forms fsdpviz accepts besides (FSDP2's explicit
prefetch maps, ``fully_shard=``'s targets, ``mesh=`` as ``init_device_mesh`` shapes it);
then the job's (``grad_accum``, ``compile``, ``float8``, ...) and fsdpviz's own
(``world_size``, ``loss``, ``trace``, ...). Keywords fsdpviz answers with what to pass
instead (``process_group``, ``device_mesh``, ``no_sync``, ``requires_gradient_sync``) are
not here. The types are for type checkers only: ``analyze`` checks every keyword it is
given at run time, unknown ones included, and says what is wrong.

Three levels, as the functions that pass them on take them:

- :class:`~fsdpviz.schema.keywords.FSDPKwargs`: FSDP's and the job's options (``tune`` and
  ``suggest`` take ``world_size``, ``machine`` and ``progress`` as their own arguments);
- :class:`~fsdpviz.schema.keywords.PlanKwargs`: those and ``world_size``, ``progress`` (a
  dashboard's ``machine=`` is the one its timeline is drawn on);
- :class:`AnalyzeKwargs`: every keyword of ``analyze``, ``machine`` too.

The first two are in :mod:`fsdpviz.schema.keywords`, where the data types' ``show()``
(``report.show(world_size=64)``) can name them too.

Example::

    def plan_twice(model: nn.Module, ids: Tensor, **kwargs: Unpack[AnalyzeKwargs]) -> Comparison:
        return fsdpviz.compare(fsdpviz.analyze(model, ids, **kwargs),
                               fsdpviz.analyze(model, ids, **{**kwargs, "world_size": 64}))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsdpviz.schema.keywords import PlanKwargs

if TYPE_CHECKING:
    from fsdpviz.cost.hardware import Machine


class AnalyzeKwargs(PlanKwargs, total=False):
    """Every keyword of :func:`fsdpviz.analyze`."""

    machine: str | Machine | None
