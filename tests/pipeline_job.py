"""A pipeline-parallel FSDP2 job as torchtitan runs one, for the gloo conformance tests.

4 ranks as a ``pp`` 2 x ``dp_shard`` 2 mesh; a small torchtitan Llama 3
(``fsdpviz.configs.torchtitan_model.Transformer``) split into stages as torchtitan's
``pipeline_module_split`` splits it (its ``_generate_llm_fqn_per_model_part``, the embedding
and the output counted as a layer each), each stage sharded as torchtitan's ``apply_fsdp``
shards it (the embedding, each block, the final norm with the output, then the stage's
root), run by ``torch.distributed.pipelining``'s own schedules. :func:`record` records every
case of :data:`CASES` on one rank with :class:`fsdpviz.recording.PipelineRecorder`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PP, DP = 2, 2
MODEL_ARGS: dict[str, Any] = {"dim": 16, "n_layers": 4, "n_heads": 2, "vocab_size": 64,
                              "multiple_of": 16}  # fmt: skip
BATCH, SEQ = 4, 8
STEPS = 3
# name -> (schedule, microbatches, torchtitan's fsdp_reshard_after_forward, a number of ranks
# to reshard to after forward (fully_shard's int reshard_after_forward, as digits), or "blocks":
# only the blocks and each part's root sharded, the roots holding the embeddings, norm and output)
CASES: dict[str, tuple[str, int, str]] = {
    "gpipe-2": ("GPipe", 2, "default"),
    "gpipe-4": ("GPipe", 4, "default"),
    "1f1b-2": ("1F1B", 2, "default"),
    "1f1b-4": ("1F1B", 4, "default"),
    "interleaved-2": ("Interleaved1F1B", 2, "default"),
    "interleaved-4": ("Interleaved1F1B", 4, "default"),
    "1f1b-4-always": ("1F1B", 4, "always"),
    "interleaved-4-always": ("Interleaved1F1B", 4, "always"),
    "looped-bfs-4": ("LoopedBFS", 4, "default"),
    "zero-bubble-4": ("InterleavedZeroBubble", 4, "default"),
    "zbv-4": ("ZBVZeroBubble", 4, "default"),
    "dualpipev-4": ("DualPipeV", 4, "default"),
    "zbv-4-blocks": ("ZBVZeroBubble", 4, "blocks"),  # rank 0's two stage roots hold parameters
}
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")


def model() -> nn.Module:
    from fsdpviz.configs.torchtitan_model import Transformer

    torch.manual_seed(0)
    return Transformer(MODEL_ARGS, SEQ).train()


def tokens() -> torch.Tensor:
    return torch.randint(0, MODEL_ARGS["vocab_size"], (BATCH, SEQ),
                         generator=torch.Generator().manual_seed(0))  # fmt: skip


def labels() -> torch.Tensor:
    return torch.randint(0, MODEL_ARGS["vocab_size"], (BATCH, SEQ),
                         generator=torch.Generator().manual_seed(1))  # fmt: skip


def loss_fn(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(pred.flatten(0, 1).float(), target.flatten(0, 1))


def stages_per_rank(schedule: str) -> int:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    return 1 if issubclass(get_schedule_class(schedule), PipelineScheduleSingle) else 2


def split(num_stages: int) -> list[list[str]]:
    """torchtitan's ``_generate_llm_fqn_per_model_part`` (input and output weight 1), with
    this model's output module named ``output``."""
    layers = MODEL_ARGS["n_layers"]
    effective = layers + 2
    per, extra = divmod(effective, num_stages)
    out: list[list[str]] = []
    current = 0
    for s in range(num_stages):
        n = per + (1 if s < extra else 0)
        names: list[str] = []
        if s == 0:
            names.append("tok_embeddings")
            n -= 1
        elif s == num_stages - 1:
            n -= 1
        for _ in range(n):
            if current < layers:
                names.append(f"layers.{current}")
                current += 1
        if s == num_stages - 1:
            names += ["norm", "output"]
        out.append(names)
    return out


def split_module(whole: nn.Module, names: list[str]) -> nn.Module:
    """torchtitan's ``_split_module``: a copy holding ``names``, the other modules gone."""
    import copy

    part = copy.deepcopy(whole)
    keep = set(names)
    for name, child in list(part.named_children()):
        if isinstance(child, nn.ModuleDict):
            wanted = {n.split(".", 1)[1] for n in keep if n.startswith(f"{name}.")}
            for key in list(child.keys()):
                if key not in wanted:
                    del child[key]
        elif name not in keep:
            setattr(part, name, None)
    return part


def reshard_after_forward(policy: str) -> bool | int:
    """``fully_shard``'s ``reshard_after_forward`` of the non-root units under ``policy``
    ("default" under PP: False; digits: that many ranks)."""
    return int(policy) if policy.isdigit() else policy == "always"


def shard(
    part: nn.Module, mesh: Any, policy: str, not_unsharded: tuple[str, ...] = (), **options: Any
) -> None:
    """torchtitan's ``apply_fsdp`` on one model part (float32 unless ``options`` holds an
    ``mp_policy``); ``not_unsharded``: the top-level modules (those the part holds) whose
    ``set_unshard_in_backward(False)`` is called."""
    from torch.distributed.fsdp import fully_shard

    raf = reshard_after_forward(policy)
    if part.tok_embeddings is not None and policy != "blocks":
        fully_shard(part.tok_embeddings, mesh=mesh, reshard_after_forward=raf, **options)
    if part.norm is not None and part.output is not None and policy != "blocks":
        fully_shard([part.norm, part.output], mesh=mesh, reshard_after_forward=raf, **options)
    for block in part.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=raf, **options)
    fully_shard(part, mesh=mesh, **options)
    for name in not_unsharded:  # a top-level module, where this part holds it
        module = getattr(part, name, None)
        if module is not None:
            module.set_unshard_in_backward(False)  # type: ignore[operator]


def build_schedule(
    mesh: Any,
    schedule_name: str,
    microbatches: int,
    policy: str,
    loss: Any = loss_fn,
    not_unsharded: tuple[str, ...] = (),
    **options: Any,
) -> tuple[Any, list[Any]]:
    """This rank's stages (torchtitan's placement: looped, or a V), each sharded by
    :func:`shard` (``options``: ``fully_shard``'s; ``not_unsharded``: its), under torch's
    schedule."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    pp_mesh, dp_mesh = mesh["pp"], mesh["dp_shard"]
    pp_rank = pp_mesh.get_local_rank()
    num_stages = PP * stages_per_rank(schedule_name)
    names = split(num_stages)
    whole = model()
    if schedule_name in V_SCHEDULES:  # torchtitan's V placement
        placed = [pp_rank, num_stages - 1 - pp_rank]
    else:  # its loop placement
        placed = list(range(pp_rank, num_stages, PP))
    stages = []
    for s in placed:
        part = split_module(whole, names[s])
        shard(part, dp_mesh, policy, not_unsharded, **options)
        stages.append(
            PipelineStage(part, s, num_stages, torch.device("cpu"), group=pp_mesh.get_group())
        )
    cls = get_schedule_class(schedule_name)
    single = issubclass(cls, PipelineScheduleSingle)
    schedule = cls(stages[0] if single else stages, n_microbatches=microbatches,
                   loss_fn=loss, scale_grads=False)  # fmt: skip
    return schedule, stages


def run_case(name: str, mesh: Any, out_dir: Path) -> None:
    from fsdpviz.recording import PipelineRecorder

    schedule_name, microbatches, policy = CASES[name]
    schedule, stages = build_schedule(mesh, schedule_name, microbatches, policy)
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)
    with PipelineRecorder(schedule) as rec:
        for _ in range(STEPS):
            target = labels() if last else None
            if first:
                schedule.step(tokens(), target=target)
            else:
                schedule.step(target=target)
            for st in stages:
                for p in st.submod.parameters():
                    p.grad = None
    rank = torch.distributed.get_rank()
    rec.report().to_json(out_dir / f"{name}-rank{rank}.json")
    (out_dir / f"{name}-rank{rank}.actions.json").write_text(json.dumps(rec.actions))


def record(rank: int, out_dir: str) -> None:
    """Every case on this rank."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp_shard"))
    for name in CASES:
        run_case(name, mesh, Path(out_dir))
