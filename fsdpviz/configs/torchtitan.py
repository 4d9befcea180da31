"""A torchtitan job (its TOML ``--job.config_file``) as the model and FSDP2 plan torchtitan
builds for it.

The job files are those of torchtitan's TOML configuration (``train_configs/*.toml``, up
to its move to Python config registries in 2026). The Llama 3 flavors (``debugmodel``,
``8B``, ``70B``, ``405B``) are built as torchtitan builds them (``Transformer`` of
``torchtitan/models/llama3/model``: the same module names and parameter shapes) on the meta
device (:mod:`~fsdpviz.configs.torchtitan_model`), and sharded as its ``apply_fsdp`` does
(:mod:`~fsdpviz.configs.torchtitan_plan`): ``tok_embeddings``, each block, ``norm``
with ``output`` (resharded after forward only under the ``"always"`` policy of
:data:`~fsdpviz.configs.torchtitan_plan.RESHARD_KEY`), then the root, with
``MixedPrecisionPolicy(param_dtype=mixed_precision_param,
reduce_dtype=mixed_precision_reduce)``, on torchtitan's mesh: ``dp_replicate`` (HSDP) when
``data_parallel_replicate_degree > 1``, ``dp_shard``, and ``tp`` with ``apply_tp``'s plan
(sequence parallel, loss parallel unless ``disable_loss_parallel``: the eager
cross-entropy then run as ``loss_parallel()`` runs it on each rank's shard) when
``tensor_parallel_degree > 1``; ``enable_cpu_offload`` gives ``CPUOffloadPolicy()``.
``activation_checkpoint.mode = "full"``
checkpoints every block, ``"selective"`` with an integer option every n-th block, with
``"op"`` per operator inside every block
(:class:`~fsdpviz.schema.checkpointing.SelectiveCheckpoint`).

The job around FSDP: ``[compile] enable`` compiles each block (``analyze(...,
compile=[TransformerBlock])``; with ``components`` including ``"loss"``, as torchtitan's
default, the whole model: the blocks and the loss, with the embedding and final norm
costed fused too, and the loss given as ``torch.compile(loss_fn)``, as torchtitan builds it,
so its memory is what torch's partitioner keeps); float8 linears
(``model.converters = ["quantize.linear.float8"]`` with ``[quantize.linear.float8]``, or
``["float8"]`` with ``[float8]``) become ``float8=`` (torchtitan's keys:
``enable_fsdp_float8_all_gather``, ``recipe_name``, ``filter_fqns``).

Older job files read as torchtitan read them then, with a note where a key was renamed:
``training.batch_size`` (``training.local_batch_size`` since June 2025),
``training.compile`` (``[compile] enable`` since August 2025, compiling the blocks only),
``training.data_parallel_*_degree``, ``training.tensor_parallel_degree``,
``training.disable_loss_parallel`` and ``experimental.{pipeline,context}_parallel_degree``
(``[parallelism]`` since March 2025), ``[float8] enable_float8_linear`` (``model.converters``
since early 2025, ``[quantize.linear.float8]`` since September 2025).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from fsdpviz.configs.common import TrainerConfig, note
from fsdpviz.configs.torchtitan_job import (
    CP_ROTATE_KEY,
    CP_ROTATE_METHOD,
    check_sections,
    compile_option,
    float8_option,
    load_job,
    mesh_degrees,
    upgrade_keys,
)
from fsdpviz.configs.torchtitan_model import FLAVORS, build_llama3
from fsdpviz.configs.torchtitan_plan import parallelize_kwargs, pipeline_kwargs
from fsdpviz.errors import ConfigError, did_you_mean
from fsdpviz.trace.probe import traced_as_share


@dataclass(frozen=True)
class TorchtitanJob:
    """The model, batch and FSDP2 plan of a torchtitan job.

    ``fsdpviz.analyze(job.model, job.inputs, **job.config)``; ``model, inputs, config =
    job`` unpacks them.
    """

    model: nn.Module
    inputs: torch.Tensor
    config: TrainerConfig

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.inputs, self.config))


def from_torchtitan(
    job: str | Path | Mapping[str, Any], *, world_size: int | None = None
) -> TorchtitanJob:
    """Read a torchtitan job TOML: the Llama 3 model it trains, one batch, and its FSDP2 plan.

    ``world_size`` is the number of ranks the job runs on; it is needed only when
    ``data_parallel_shard_degree = -1`` (torchtitan's default: every rank; default 8).

    Example::

        job = fsdpviz.from_torchtitan("llama3_8b.toml", world_size=8)
        report = fsdpviz.analyze(job.model, job.inputs, **job.config)
    """
    data, where = load_job(job)
    data = copy.deepcopy(data)  # the older keys move: never in the caller's dict
    notes = upgrade_keys(data, where)
    notes += check_sections(data, where)
    model_cfg = data.get("model", {})
    name = model_cfg.get("name", "llama3")
    if name != "llama3":
        raise ConfigError(f"{where}: model.name {name!r} is not modelled; fsdpviz builds llama3")
    flavor = str(model_cfg.get("flavor", "debugmodel"))
    if flavor not in FLAVORS:
        tip = did_you_mean(flavor, FLAVORS)
        raise ConfigError(
            f"{where}: model.flavor {flavor!r} is not a llama3 flavor ({', '.join(FLAVORS)}){tip}"
        )
    float8 = float8_option(data, where, notes)
    for converter in model_cfg.get("converters", []) or []:
        if converter not in ("float8", "quantize.linear.float8"):
            note(
                notes,
                f"{where}: model.converters {converter!r} (quantized training) is not modelled",
            )
    training = data.get("training", {})
    parallel = data.get("parallelism", {})
    seq = int(training.get("seq_len", 2048))
    batch = int(training.get("local_batch_size", 8))
    rotate = parallel.get(CP_ROTATE_KEY, CP_ROTATE_METHOD)
    if int(parallel.get("context_parallel_degree", 1)) > 1 and rotate != CP_ROTATE_METHOD:
        note(
            notes,
            f"{where}: {CP_ROTATE_KEY} = {rotate!r} is not modelled; ring "
            f"attention is planned with torch's default {CP_ROTATE_METHOD!r} (keys and values "
            "gathered once per attention)",
        )
    parallel_dims = mesh_degrees(parallel, world_size, where, notes)
    if int(training.get("global_batch_size", -1)) > batch * parallel_dims.dp:
        steps = int(training["global_batch_size"]) // (batch * parallel_dims.dp)
        note(
            notes,
            f"{where}: global_batch_size = {training['global_batch_size']} means "
            f"{steps} micro-batches per step, each reducing its gradients (torchtitan does not "
            f"skip gradient sync); one is planned (time the step with "
            f"fsdpviz.cost.timeline(report, grad_accum={steps}))",
        )
    model = build_llama3(flavor, seq)
    tokens = torch.zeros(batch, seq, dtype=torch.long)
    # torchtitan's enable_float8_tensorwise_tp: float8 linears of a tensorwise recipe
    tensorwise = float8 is not None and float8.get("recipe_name", "tensorwise") == "tensorwise"
    kwargs = parallelize_kwargs(
        model, data, parallel_dims, where, notes, float8_tensorwise=tensorwise
    )
    if parallel_dims.pp > 1:
        kwargs.update(pipeline_kwargs(model, parallel, parallel_dims.pp, batch, where, notes))
    # the loss of one microbatch under pipeline parallelism (the last stage's), else the batch;
    # one rank's labels: context parallelism cuts them as it cuts the tokens
    rows = batch // int(cast(int, kwargs.get("microbatches", 1)))  # pipeline_kwargs sets an int
    labels = torch.zeros(rows, seq // parallel_dims.cp, dtype=torch.long, device="meta")
    loss_parallel = parallel_dims.tp > 1 and not parallel.get("disable_loss_parallel", False)
    kwargs["loss"] = _LossParallelCrossEntropy(labels) if loss_parallel else _CrossEntropy(labels)
    compiled = compile_option(data.get("compile", {}), where, notes)
    if compiled:
        kwargs["compile"] = compiled
    if compiled is True:  # the blocks and the loss: torchtitan's torch.compile(loss_fn)
        loss = _CrossEntropy(labels)  # Inductor's kernels, whichever eager ones it replaces
        kwargs["loss"] = cast("Callable[[Any], torch.Tensor]", torch.compile(loss))
    if float8 is not None:
        kwargs["float8"] = float8
    config = TrainerConfig(f"torchtitan job {where} (llama3 {flavor})", kwargs, notes)
    return TorchtitanJob(model, tokens, config)


class _CrossEntropy:
    """torchtitan's loss: cross-entropy of the float32 logits against the labels (the first
    samples', for a micro-batch of fewer)."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels = labels

    def __call__(self, pred: torch.Tensor) -> torch.Tensor:
        labels = self.labels[: pred.shape[0]]
        loss: torch.Tensor = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        return loss


class _LossParallelCrossEntropy(_CrossEntropy):
    """torchtitan's loss under tensor parallelism with loss parallel (``train_context``
    enters ``torch.distributed.tensor.parallel.loss_parallel()``): each rank's cross-entropy
    of its vocabulary shard of the float32 logits, run eagerly as torch's handlers in
    ``torch/distributed/tensor/parallel/loss.py`` run it on the local shard. ``_log_softmax``
    makes the shifted logits and their exponent beside its result (one kernel each, where
    ``aten._log_softmax`` makes its result alone); the backward of ``nll_loss`` and
    ``log_softmax`` together (``_nll_loss_and_log_softmax_backward``) makes the one-hot
    gradient, the result's exponent, their sum and its product by the loss's gradient, with
    the saved result still held: four float32 tensors of the logits' shard at once, where
    ``nll_loss_backward`` and ``_log_softmax_backward_data`` hold three. The all-reduces of
    the maxima, the sums and the picked logits (a few values per token) are left out.

    Logits that are not one rank's share of the vocabulary (a configuration ``tune`` tries
    without tensor parallelism) take torch's own cross-entropy, as torchtitan without
    tensor parallelism does: the trace says which
    (:func:`~fsdpviz.trace.probe.traced_as_share`)."""

    def __call__(self, pred: torch.Tensor) -> torch.Tensor:
        if not traced_as_share(pred):  # the output projection's columns: the vocabulary
            return super().__call__(pred)
        labels = self.labels[: pred.shape[0]]
        loss: torch.Tensor = _VocabShardCrossEntropy.apply(  # type: ignore[no-untyped-call]
            pred.flatten(0, 1).float(), labels.flatten(0, 1)
        )
        return loss


class _VocabShardCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of ``x`` (tokens x vocabulary) as loss parallel computes it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = x - torch.amax(x, 1, keepdim=True)
        logsumexp = torch.log(torch.sum(torch.exp(shifted), 1, keepdim=True))
        result = shifted - logsumexp
        del shifted
        ctx.save_for_backward(result, labels)
        return -torch.gather(result, 1, labels[:, None]).sum() / labels.numel()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        result, labels = ctx.saved_tensors
        grad_input = torch.zeros_like(result)
        grad_input.scatter_(1, labels[:, None], -1.0)
        out = (grad_input + torch.exp(result)) * (grad / labels.numel())
        return out, None


__all__ = ["TorchtitanJob", "build_llama3", "from_torchtitan"]
