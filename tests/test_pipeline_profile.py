"""The stitching of a pipeline rank's step profile (:func:`rank_step_profile`), on stage
profiles written out by hand: what it keeps must not depend on how many hook calls split a
stage's backward."""

from __future__ import annotations

from fsdpviz.schedule.pipeline_profile import Call, StageShape, rank_step_profile
from fsdpviz.schema.profile import StepProfile

UNIT = "layers.0"


def _stage(backward: list[dict[str, int]]) -> StepProfile:
    """A stage of one unit: its forward, the forward's end, then its backward's hook calls
    (pre-backward, a tensor-parallel collective, post-backward, the final callback), with the
    unit's gradients made in the stretch before each (``backward``)."""
    hooks: list[tuple[str, str, object]] = [
        ("pre_forward", UNIT, None),
        ("forward_end", "", None),
        ("pre_backward", UNIT, None),
        ("tp_backward", UNIT, None),
        ("post_backward", UNIT, True),
        ("final_callback", "(root of stage 0)", {}),
    ]
    n = len(hooks)
    zeros = [0] * n
    return StepProfile(
        hooks=hooks, event_hook=[], flops_forward=[0.0] * n, flops_backward=[0.0] * n,
        activations=zeros, forward_temp=zeros, backward_temp=zeros, peak=zeros,
        peak_activations=zeros, peak_forward_temp=zeros, peak_grads=zeros,
        grads=[{}, {}, *backward],
    )  # fmt: skip


def _held(grads: list[dict[str, int]], microbatches: int = 3) -> list[int]:
    """The unit's gradient bytes the rank holds after each call of a step of ``microbatches``
    forwards and backwards of the stage, reducing in twice its compute dtype's bytes."""
    prof = _stage(grads)
    calls: list[Call] = []
    for mb in range(microbatches):
        calls += [Call(h, u, a, [], 0, k, mb, "F") for k, (h, u, a) in enumerate(prof.hooks[:2])]
        calls += [
            Call(h, u, a, [], 0, k + 2, mb, "B") for k, (h, u, a) in enumerate(prof.hooks[2:])
        ]
    shapes = {0: StageShape(forward_end=1, last=False, output_bytes=0, units=frozenset({UNIT}))}
    step, _ = rank_step_profile(calls, {0: prof}, shapes, upcast={UNIT: 2.0})
    held, out = 0, []
    for g in step.grads:
        held += g.get(UNIT, 0)
        out.append(held)
    return out


def test_a_units_gradients_made_over_several_stretches_are_all_cast_to_the_reduce_dtype() -> None:
    """FSDP2 without gradient sync casts all of a unit's first gradients to the reduce dtype
    at its post-backward (``to_accumulated_grad_if_needed``), however many hook calls (a
    tensor-parallel collective between two of its linears) came between them: 100 + 50
    bytes then hold 300, as 150 in one stretch do, and each later microbatch's 150 is added
    into that copy and freed."""
    whole = _held([{}, {UNIT: 150}, {}, {}])
    split = _held([{}, {UNIT: 100}, {UNIT: 50}, {}])
    assert whole[-1] == split[-1] == 300
    # after each backward's post-backward (the calls of one microbatch: 2 forward, 4 backward)
    assert [split[k] for k in (4, 10, 16)] == [whole[k] for k in (4, 10, 16)] == [300] * 3
