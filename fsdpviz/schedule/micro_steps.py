"""The iterations a prediction holds, each a micro-step of gradient accumulation run by a
runtime port from its hook calls: what ``analyze`` does after its trace (FSDP1's steady state,
FSDP2's every micro-step after the first) and a replay does with every traced iteration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsdpviz.plan.job import micro_step_syncs
from fsdpviz.schedule.fsdp1_runtime import FSDP1Runtime
from fsdpviz.schedule.fsdp2_runtime import FSDP2Runtime
from fsdpviz.schema.events import Event

HookLog = list[tuple[str, int, Any]]


def run_micro_steps(
    runtime: FSDP1Runtime | FSDP2Runtime,
    logs: Sequence[HookLog],
    grad_accum: int,
    accumulating: tuple[bool, bool] = (True, True),
    start: int = 0,
) -> tuple[list[list[Event]], list[list[int]]]:
    """Run the iterations from ``start`` on (:func:`~fsdpviz.plan.job.micro_step_syncs`: two
    optimizer steps of ``grad_accum`` micro-steps), the ``n``-th from ``logs[n]`` (the last log
    for the rest), each with its gradient sync (FSDP2's ``accumulating``: what the micro-steps
    before the last set, reshard after backward and all-reduce), then the optimizer step.
    Returns each iteration's events and, per event, the index of the hook call that made it
    (the optimizer step's, the last call's); the runtime is left synchronising."""
    iterations: list[list[Event]] = []
    event_hooks: list[list[int]] = []
    syncs = micro_step_syncs(grad_accum)
    for n in range(start, len(syncs)):
        runtime.micro_step(syncs[n], *accumulating)
        log = logs[min(n, len(logs) - 1)]
        event_hook: list[int] = []
        for k, entry in enumerate(log):
            runtime.replay([entry])
            event_hook.extend([k] * (len(runtime.events) - len(event_hook)))
        runtime.optimizer_step()
        event_hook.extend([len(log) - 1] * (len(runtime.events) - len(event_hook)))
        iterations.append(runtime.take_events())
        event_hooks.append(event_hook)
    runtime.micro_step(True)
    return iterations, event_hooks
