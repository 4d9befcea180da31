"""A parameterised machine for the time model: GPU throughput and collective bandwidth.

Every constant can be overridden::

    m = machine("h100")                                   # H100 SXM, NVLink 4, InfiniBand NDR
    m = machine("a100", network="roce-200")               # another inter-node fabric
    m = machine("h100", compute_efficiency=0.6, inter_node_gbps=40.0)
    m = Machine(name="mine", tflops={"bfloat16": 500.0}, intra_node_gbps=200.0, ...)

Compute: each kernel the trace saw gets a roofline time (:mod:`fsdpviz.cost.kernels`):
matrix multiplies at ``tflops[d] * compute_efficiency`` for large GEMMs (float8 ones times
``float8_matmul_share``: below 1 where the vendor measures a float8 GEMM short of the data
sheet's ratio to bf16, 0.90 on MI300X), less for small ones (``gemm_half_us``: a GEMM
that would take this long reaches half of that), fused attention at
``attention_efficiency`` / ``attention_backward_efficiency`` of the peak
(for long sequences, ``attention_seq_half`` the sequence length at which it is half that),
memory-bound kernels at ``hbm_gbps * memory_efficiency`` plus ``kernel_us`` each, and the
CPU issuing ``launch_forward_us`` / ``launch_backward_us`` per kernel. The presets'
efficiencies are calibrated on published training runs (``benchmarks/bench_published.py``).
A report without kernel records (saved before they were measured) is timed at
``flops / (tflops[d] * compute_efficiency)``.

CPU offload: a shard's copy to the device before its all-gather, and a gradient shard's
copy back after its reduction, take ``bytes / pcie_gbps``; the optimizer step runs on the
host at ``host_gbps``.

float32 matrix multiplies run at ``tflops["float32"]`` (CUDA cores) under torch's default
``float32_matmul_precision`` ``"highest"``, and on TF32 tensor cores (``tflops["tfloat32"]``)
under ``"high"`` or ``"medium"`` (``torch.set_float32_matmul_precision``, or
``torch.backends.cuda.matmul.allow_tf32 = True``). ``float32_matmul_precision=None`` takes
the report's: what ``analyze`` saw in the process, or its ``float32_matmul_precision=``.

Collectives as NCCL's ring runs them, over ``N`` ranks moving ``S`` bytes (the unsharded
size; each rank sends and receives ``(N - 1) / N * S``, twice for an all-reduce:
:func:`ring_bytes`)::

    all_gather, reduce_scatter:  base + (N - 1) * step + (N - 1) / N * S / busbw
    all_reduce:                  base + 2 (N - 1) * step + 2 (N - 1) / N * S / busbw

The ranks sit on nodes as the mesh lays them out (:mod:`fsdpviz.cost.topology`: a
:class:`~fsdpviz.cost.topology.Span`; without one, ``N`` consecutive ranks). A ring is as
fast as the slowest link it crosses: inside one node ``busbw`` is ``intra_node_gbps``
(GB/s per GPU: NVLink through NVSwitch, or PCIe), or, where the node's GPUs are linked
point to point (``intra_node_mesh=True``: 4-GPU HGX boards, NVLink bridges), the share of
it the links among the group's ``k`` GPUs in the node carry, ``(k - 1) / (gpus_per_node -
1)`` (:meth:`Machine.intra_gbps`); a ring that crosses nodes leaves each
node through its network cards (``inter_node_gbps`` per GPU, ``gpus_per_node`` of them),
which the groups of that mesh dimension with ranks in the node share (``sharing``: the
replicate groups of HSDP, one per shard rank, run their all-reduces at the same time), so
``busbw = min(intra, gpus_per_node * inter_node_gbps / sharing)``; times
``comm_efficiency``. ``step`` is ``intra_node_latency_us`` inside a node, else
``inter_node_latency_us`` (a ring step waits for its slowest hop); an all-reduce across
nodes takes NCCL's tree where its latency is lower (``2 (ceil(log2 nodes) *
inter_node_latency_us + (per_node - 1) * intra_node_latency_us)``); ``base`` is
``collective_base_us``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import NotRequired, TypedDict, Unpack

from fsdpviz.cost.topology import Span, consecutive
from fsdpviz.errors import ConfigError
from fsdpviz.plan.job import FLOAT32_MATMUL_PRECISIONS


@dataclass(frozen=True)
class Machine:
    """One GPU type in nodes of ``gpus_per_node``, with its intra- and inter-node links."""

    name: str
    tflops: dict[str, float]  # dense peak TFLOP/s per compute dtype (the data sheet's)
    memory_gib: float  # device memory
    hbm_gbps: float  # device memory bandwidth, GB/s
    intra_node_gbps: float  # per-GPU collective bandwidth inside a node, GB/s
    inter_node_gbps: float  # per-GPU network bandwidth across nodes, GB/s
    gpus_per_node: int = 8
    # CPU offload: host-to-device / device-to-host copies of shards and gradients (GB/s per
    # GPU, one direction, achieved with pinned memory) and the host memory bandwidth one rank's
    # optimizer step gets on the CPU (GB/s).
    pcie_gbps: float = 25.0
    host_gbps: float = 20.0
    intra_node_latency_us: float = 1.0  # per ring step over NVLink / PCIe
    inter_node_latency_us: float = 2.5  # per ring step when the ring crosses nodes
    collective_base_us: float = 10.0  # per collective
    compute_efficiency: float = 0.6  # share of the peak a large matrix multiply reaches
    # a large float8 multiply's share of the float8 peak, relative to compute_efficiency (a
    # bf16 one's share of the bf16 peak): 1.0 where float8 multiplies reach the data sheet's
    # float8 to bf16 ratio; the GPU vendor's measured ratio over the data sheet's where lower
    float8_matmul_share: float = 1.0
    gemm_half_us: float = 3.0  # a GEMM this long at compute_efficiency reaches half of it
    attention_efficiency: float = 0.5  # fused attention forward, long sequences, head dim 128
    attention_backward_efficiency: float = 0.4
    attention_seq_half: float = 256.0
    efficient_attention_factor: float = 0.7  # memory-efficient kernel against flash
    memory_efficiency: float = 0.8  # share of hbm_gbps memory-bound kernels reach
    kernel_us: float = 1.5  # least GPU time of a kernel
    launch_forward_us: float = 10.0  # CPU time to issue one kernel in forward (eager)
    launch_backward_us: float = 6.0  # ... in backward (the autograd engine)
    comm_efficiency: float = 0.8
    network: str = ""
    # float32 matrix multiplies: "highest" (CUDA cores), "high" / "medium" (TF32 tensor
    # cores, tflops["tfloat32"]); None: the report's setting (what analyze saw)
    float32_matmul_precision: str | None = None
    compiled_launch_us: float = 4.0  # CPU time to launch one kernel of a torch.compile'd graph
    # the GPUs of a node linked point to point, each pair by an equal share of a GPU's links
    # (no switch: NVIDIA's 4-GPU HGX boards, NVLink bridges): see intra_gbps
    intra_node_mesh: bool = False
    # whether torch's caching allocator on this machine honours PYTORCH_CUDA_ALLOC_CONF=
    # "expandable_segments:True" (torchtitan's run_train.sh sets it): one growing segment per
    # stream. Not on ROCm before 7.0: torch's ROCm builds ignore it with a warning
    # ("expandable_segments not supported on this platform"; ExpandableSegment is compiled
    # only for CUDA), until pytorch/pytorch#177974 (March 2026), which #179930 limits to
    # ROCm 7.0 and later. Without them the reserved estimate replays the allocator's fixed
    # segments for the communication streams' pools (fsdpviz.cost.memory).
    expandable_segments: bool = True

    def peak_flops(self, dtype: str | None) -> float:
        """Dense peak FLOP/s in ``dtype`` (``"bfloat16"``, ...); float32 on TF32 tensor cores
        when ``float32_matmul_precision`` is ``"high"`` or ``"medium"``."""
        key = dtype if dtype in self.tflops else "float32"
        if key == "float32" and self.tf32 and "tfloat32" in self.tflops:
            key = "tfloat32"
        if key not in self.tflops:
            raise ConfigError(
                f"machine {self.name!r} has no throughput for {dtype!r}; pass "
                f"tflops={{{dtype!r}: ...}} to machine()"
            )
        return self.tflops[key] * 1e12

    @property
    def tf32(self) -> bool:
        """Whether float32 matrix multiplies run on TF32 tensor cores."""
        return self.float32_matmul_precision in ("high", "medium")

    def matmul_flops(self, dtype: str | None) -> float:
        """FLOP/s a large matrix multiply in ``dtype`` reaches: the peak times
        ``compute_efficiency``, and for float8 operands times ``float8_matmul_share``."""
        rate = self.peak_flops(dtype) * self.compute_efficiency
        if dtype is not None and dtype.startswith("float8"):
            rate *= self.float8_matmul_share
        return rate

    def compute_seconds(self, flops: float, dtype: str | None) -> float:
        """Seconds for ``flops`` FLOPs of large matrix multiplies in ``dtype``."""
        if flops <= 0:
            return 0.0
        return flops / self.matmul_flops(dtype)

    def matmul_seconds(self, flops: float, dtype: str | None, count: int = 1) -> float:
        """Seconds for ``count`` matrix multiplies of ``flops / count`` FLOPs each: a GEMM
        that would take ``t`` at :meth:`matmul_flops` takes ``t + gemm_half_us`` (its
        efficiency is ``compute_efficiency * t / (t + gemm_half_us)``: small GEMMs reach
        less of the peak)."""
        if flops <= 0:
            return 0.0
        return flops / self.matmul_flops(dtype) + count * self.gemm_half_us * 1e-6

    def memory_seconds(self, nbytes: float) -> float:
        """Seconds to read and write ``nbytes`` of device memory."""
        return nbytes / (self.hbm_gbps * 1e9 * self.memory_efficiency) if nbytes > 0 else 0.0

    def intra_gbps(self, ranks: int) -> float:
        """The per-GPU bandwidth inside a node of a ring over ``ranks`` of its GPUs (GB/s):
        ``intra_node_gbps`` through a switch (NVSwitch); over point-to-point links
        (``intra_node_mesh``) a GPU reaches its peers in the group only through the links it
        has to each, ``intra_node_gbps / (gpus_per_node - 1)`` a peer, so the ring gets
        ``(ranks - 1) / (gpus_per_node - 1)`` of it: a third for two of four H200 on an HGX
        board (6 of each GPU's 18 NVLinks join a pair), all of it for the four. A single
        rank in the node crosses no link inside it (``intra_node_gbps``)."""
        n = self.gpus_per_node
        if not self.intra_node_mesh or ranks <= 1 or ranks >= n:
            return self.intra_node_gbps
        return self.intra_node_gbps * (ranks - 1) / (n - 1)

    def collective_seconds(
        self, kind: str, nbytes: float, ranks: int, span: Span | None = None
    ) -> float:
        """Seconds for an ``all_gather`` / ``reduce_scatter`` / ``all_reduce`` of ``nbytes``
        over ``ranks`` placed as ``span`` says (default: consecutive ranks)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        where = span if span is not None and span.ranks == ranks else None
        where = where or consecutive(ranks, self.gpus_per_node)
        passes = 2 if kind == "all_reduce" else 1
        inside = self.intra_gbps(where.per_node)
        if not where.across_nodes:
            gbps, latency = inside, passes * (ranks - 1) * self.intra_node_latency_us
        else:
            # the ring leaves each node through its network cards, shared by the groups of
            # this mesh dimension that cross the node at the same time; NVLink inside
            cards = self.gpus_per_node * self.inter_node_gbps / max(1, where.sharing)
            gbps = min(inside, cards)
            latency = passes * (ranks - 1) * self.inter_node_latency_us
            if kind == "all_reduce":  # NCCL's tree, where its latency is lower
                tree = 2 * (
                    math.ceil(math.log2(where.nodes)) * self.inter_node_latency_us
                    + (where.per_node - 1) * self.intra_node_latency_us
                )
                latency = min(latency, tree)
        return (
            self.collective_base_us * 1e-6
            + latency * 1e-6
            + ring_bytes(kind, nbytes, ranks) / (gbps * 1e9 * self.comm_efficiency)
        )

    def p2p_seconds(self, nbytes: float, across_nodes: bool) -> float:
        """Seconds for a send of ``nbytes`` to one peer (pipeline parallelism's activations and
        their gradients): NVLink inside a node, the GPU's own network card across nodes."""
        if nbytes <= 0:
            return 0.0
        gbps = self.inter_node_gbps if across_nodes else self.intra_gbps(2)
        latency = self.inter_node_latency_us if across_nodes else self.intra_node_latency_us
        return (self.collective_base_us + latency) * 1e-6 + nbytes / (
            gbps * 1e9 * self.comm_efficiency
        )

    def send_seconds(self, nbytes: float, span: Span | None = None) -> float:
        """Seconds for each rank of a ring over ``span`` to send ``nbytes`` to the next one at
        once (context parallelism's rotation of a buffer, an ``all_to_all`` with one
        destination per rank): a ring inside a node at ``intra_node_gbps``; one across
        nodes sends through a network card (``inter_node_gbps``)."""
        if nbytes <= 0 or span is None or span.ranks <= 1:
            return 0.0
        if span.across_nodes:
            gbps = min(self.intra_gbps(2), self.inter_node_gbps)
            latency = self.inter_node_latency_us
        else:  # each rank sends to one peer: the links of one pair
            gbps, latency = self.intra_gbps(2), self.intra_node_latency_us
        return (
            self.collective_base_us * 1e-6
            + latency * 1e-6
            + nbytes / (gbps * 1e9 * self.comm_efficiency)
        )

    def copy_seconds(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` between host and device memory (CPU offload)."""
        return nbytes / (self.pcie_gbps * 1e9) if nbytes > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# Dense (no sparsity) peak throughput from the vendors' data sheets; float32 is the
# non-tensor-core rate, tfloat32 that of TF32 tensor cores (float32_matmul_precision "high").
# The efficiencies are what PyTorch reaches on each: one factor per GPU on the compute and
# attention efficiencies, fitted on the calibration row of that GPU in
# benchmarks/bench_published.py (docs/cost.md names each run): h100 (llm-foundry MPT 7B on 8
# H100), h100-hbm2e (torchtitan Llama 3.1 8B on 8 H100 96 GB), a100 (torchtitan Llama 3 8B on
# 64 A100), a100-40gb (llm-foundry MPT 7B on 8 A100 40 GB), h200 (KempnerForge 7B, FSDP2 on
# 4 H200), mi300x (torchao's torchtitan Llama 3 8B bf16 on 8 MI300X), b200 (the same on 8
# B200 capped at 750 W). No published run was found to fit h100-pcie (the H100 SXM's
# factor) or l40s (the median factor).
_H100_TFLOPS = {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0, "tfloat32": 494.5,
                "float8_e4m3fn": 1979.0}  # fmt: skip
_A100_TFLOPS = {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5, "tfloat32": 156.0}
_H100_PCIE_TFLOPS = {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0, "tfloat32": 378.0,
                     "float8_e4m3fn": 1513.0}  # fmt: skip
_L40S_TFLOPS = {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6, "tfloat32": 183.0,
                "float8_e4m3fn": 733.0}  # fmt: skip
# HGX B200 (1000 W) and AMD Instinct MI300X (750 W) data sheets
_B200_TFLOPS = {"bfloat16": 2250.0, "float16": 2250.0, "float32": 75.0, "tfloat32": 1100.0,
                "float8_e4m3fn": 4500.0}  # fmt: skip
_MI300X_TFLOPS = {"bfloat16": 1307.4, "float16": 1307.4, "float32": 163.4, "tfloat32": 653.7,
                  "float8_e4m3fn": 2614.9, "float8_e4m3fnuz": 2614.9}  # fmt: skip
# h200: the H100 SXM's efficiencies times 1.36, fitted on KempnerForge's 7B FSDP2 run on 4
# H200 (benchmarks/bench_published.py --fit)
H200_COMPUTE, H200_ATTENTION, H200_ATTENTION_BACKWARD = 0.738, 0.389, 0.308
# mi300x: the H100 SXM's efficiencies times 0.555, fitted on torchao's Llama 3 8B bf16 run
# (torchtitan, FSDP2, compile) on 8 MI300X (benchmarks/bench_published.py --fit)
MI300X_COMPUTE, MI300X_ATTENTION, MI300X_ATTENTION_BACKWARD = 0.301, 0.158, 0.126
# mi300x's float8 multiplies: AMD's Max-Achievable FLOPs of hipBLASLt GEMMs (commit db8e93b,
# ROCm 6.3) on MI300X at 750 W, "Measuring Max-Achievable FLOPs - Part 2" (ROCm/rocm-blogs,
# Table 1): BF16 708 TFLOP/s (1207 MHz), FP8 1273 (1230 MHz), 1.80 times, where the data
# sheet says 2.00 (FP8 reaches 83% of its peak at its clock, BF16 94%). Its footnote 4 says
# 1223.6 TFLOP/s at 1273 MHz instead; the table's pair is taken: its efficiencies are those
# of MI325X, the same compute die, in the table (FP8/BF16 1519/843) and footnote (1527.7/840.8)
# alike, 83% and 94%, where the footnote's pair would be 77%.
MI300X_FLOAT8_MATMUL_SHARE = (1273.0 / 708.0) / (
    _MI300X_TFLOPS["float8_e4m3fnuz"] / _MI300X_TFLOPS["bfloat16"]
)
# b200: the H100 SXM's efficiencies times 0.531, fitted on the same recipe on 8 B200 capped
# at 750 W (the peaks above are the 1000 W data sheet's; benchmarks/bench_published.py --fit)
B200_COMPUTE, B200_ATTENTION, B200_ATTENTION_BACKWARD = 0.288, 0.152, 0.120


class GPUPreset(TypedDict):
    """A GPU of :data:`GPUS`: :class:`Machine`'s constants of that GPU (its ``network``, the
    links of its usual host, sets ``intra_node_gbps`` and ``inter_node_gbps``; ``pcie_gbps``,
    where not given, is Machine's default)."""

    name: str
    tflops: dict[str, float]
    memory_gib: float
    hbm_gbps: float
    pcie_gbps: NotRequired[float]
    network: str
    compute_efficiency: float
    attention_efficiency: float
    attention_backward_efficiency: float
    float8_matmul_share: NotRequired[float]
    expandable_segments: NotRequired[bool]


GPUS: dict[str, GPUPreset] = {
    "h100": {
        "name": "H100 SXM 80GB",
        "tflops": _H100_TFLOPS,
        "memory_gib": 80.0,
        "hbm_gbps": 3350.0,
        "pcie_gbps": 50.0,  # PCIe 5 x16: 64 GB/s per direction
        "network": "nvlink4+ib-ndr",
        "compute_efficiency": 0.542,
        "attention_efficiency": 0.284,
        "attention_backward_efficiency": 0.226,
    },
    # H100 SXM with 96 GB of HBM2e at 500 W (Meta's Grand Teton hosts, torchtitan's
    # published runs): the same data-sheet peak, lower clocks under the power cap.
    "h100-hbm2e": {
        "name": "H100 96GB HBM2e 500W",
        "tflops": _H100_TFLOPS,
        "memory_gib": 96.0,
        "hbm_gbps": 2400.0,
        "pcie_gbps": 50.0,
        "network": "nvlink4+roce-400",
        "compute_efficiency": 0.576,
        "attention_efficiency": 0.317,
        "attention_backward_efficiency": 0.248,
    },
    "h100-pcie": {
        "name": "H100 PCIe 80GB",
        "tflops": _H100_PCIE_TFLOPS,
        "memory_gib": 80.0,
        "hbm_gbps": 2000.0,
        "pcie_gbps": 50.0,
        "network": "pcie5+ib-ndr",
        "compute_efficiency": 0.488,
        "attention_efficiency": 0.270,
        "attention_backward_efficiency": 0.210,
    },
    "h200": {
        "name": "H200 SXM 141GB",
        "tflops": _H100_TFLOPS,
        "memory_gib": 141.0,
        "hbm_gbps": 4800.0,
        "pcie_gbps": 50.0,
        "network": "nvlink4+ib-ndr",
        "compute_efficiency": H200_COMPUTE,
        "attention_efficiency": H200_ATTENTION,
        "attention_backward_efficiency": H200_ATTENTION_BACKWARD,
    },
    "a100": {
        "name": "A100 SXM 80GB",
        "tflops": _A100_TFLOPS,
        "memory_gib": 80.0,
        "hbm_gbps": 2039.0,
        "network": "nvlink3+ib-hdr",
        "compute_efficiency": 0.718,
        "attention_efficiency": 0.582,
        "attention_backward_efficiency": 0.449,
    },
    "a100-40gb": {
        "name": "A100 SXM 40GB",
        "tflops": _A100_TFLOPS,
        "memory_gib": 40.0,
        "hbm_gbps": 1555.0,
        "network": "nvlink3+ib-hdr",
        "compute_efficiency": 0.669,
        "attention_efficiency": 0.545,
        "attention_backward_efficiency": 0.419,
    },
    "b200": {
        "name": "B200 SXM 180GB",
        "tflops": _B200_TFLOPS,
        "memory_gib": 180.0,
        "hbm_gbps": 8000.0,
        "pcie_gbps": 50.0,
        "network": "nvlink5+ib-ndr",
        "compute_efficiency": B200_COMPUTE,
        "attention_efficiency": B200_ATTENTION,
        "attention_backward_efficiency": B200_ATTENTION_BACKWARD,
    },
    "mi300x": {
        "name": "MI300X 192GB",
        "tflops": _MI300X_TFLOPS,
        "memory_gib": 192.0,
        "hbm_gbps": 5300.0,
        "pcie_gbps": 50.0,
        "network": "xgmi+roce-400",
        "compute_efficiency": MI300X_COMPUTE,
        "attention_efficiency": MI300X_ATTENTION,
        "attention_backward_efficiency": MI300X_ATTENTION_BACKWARD,
        "float8_matmul_share": MI300X_FLOAT8_MATMUL_SHARE,
        # the ROCm 6 stack of its published runs (torch 2.9 nightly, ROCm 6.4)
        "expandable_segments": False,
    },
    "l40s": {
        "name": "L40S 48GB",
        "tflops": _L40S_TFLOPS,
        "memory_gib": 48.0,
        "hbm_gbps": 864.0,
        "network": "pcie4+roce-200",
        "compute_efficiency": 0.54,
        "attention_efficiency": 0.39,
        "attention_backward_efficiency": 0.3,
    },
}
GPUS["h100-sxm"] = GPUS["h100"]
GPUS["a100-80gb"] = GPUS["a100"]

# Achievable per-GPU bandwidth (GB/s, one direction) of each link, before comm_efficiency.
INTRA_NODE = {
    "nvlink5": 900.0,  # B200 NVLink 5 through NVSwitch: 1.8 TB/s bidirectional
    "nvlink4": 450.0,  # H100/H200 NVLink 4 through NVSwitch: 900 GB/s bidirectional
    "nvlink3": 300.0,  # A100 NVLink 3 through NVSwitch: 600 GB/s bidirectional
    "xgmi": 448.0,  # MI300X Infinity Fabric: 7 links of 64 GB/s each way, fully connected
    "pcie5": 64.0,
    "pcie4": 32.0,
}
# intra-node links that join each pair of GPUs directly, without a switch
# (Machine.intra_node_mesh): MI300X's Infinity Fabric
POINT_TO_POINT = frozenset({"xgmi"})
INTER_NODE = {
    "ib-ndr": 50.0,  # InfiniBand NDR, 400 Gb/s per GPU
    "ib-hdr": 25.0,  # InfiniBand HDR, 200 Gb/s per GPU
    "roce-400": 50.0,  # RoCE, 400 Gb/s per GPU
    "roce-200": 25.0,
    "roce-100": 12.5,
}


class MachineOverrides(TypedDict, total=False):
    """The constants of a :class:`Machine` by name, as :func:`machine` overrides them (each
    field's meaning is on :class:`Machine`), but ``network``: :func:`machine`'s own argument."""

    name: str
    tflops: dict[str, float]
    memory_gib: float
    hbm_gbps: float
    intra_node_gbps: float
    inter_node_gbps: float
    gpus_per_node: int
    pcie_gbps: float
    host_gbps: float
    intra_node_latency_us: float
    inter_node_latency_us: float
    collective_base_us: float
    compute_efficiency: float
    float8_matmul_share: float
    gemm_half_us: float
    attention_efficiency: float
    attention_backward_efficiency: float
    attention_seq_half: float
    efficient_attention_factor: float
    memory_efficiency: float
    kernel_us: float
    launch_forward_us: float
    launch_backward_us: float
    comm_efficiency: float
    float32_matmul_precision: str | None
    compiled_launch_us: float
    intra_node_mesh: bool
    expandable_segments: bool


def ring_bytes(kind: str, nbytes: float, ranks: int) -> float:
    """The bytes each rank sends (and receives) in NCCL's ring ``kind`` of ``nbytes`` (the
    unsharded size) over ``ranks``: ``(ranks - 1) / ranks`` of it, twice for an
    ``all_reduce`` (a reduce-scatter, then an all-gather).

    >>> ring_bytes("all_gather", 800, 8), ring_bytes("all_reduce", 800, 8)
    (700.0, 1400.0)
    """
    return (ranks - 1) / ranks * nbytes * (2 if kind == "all_reduce" else 1)


def machine(
    gpu: str | Machine = "h100", network: str | None = None, **overrides: Unpack[MachineOverrides]
) -> Machine:
    """A preset (``"h100"``, ``"h100-hbm2e"``, ``"h100-pcie"``, ``"h200"``, ``"b200"``,
    ``"mi300x"``, ``"a100"``, ``"a100-40gb"``, ``"l40s"``) with any constant overridden.

    ``network`` is ``"<intra>+<inter>"`` or just one of them, from
    ``INTRA_NODE`` (``nvlink5``, ``nvlink4``, ``nvlink3``, ``xgmi``, ``pcie5``, ``pcie4``) and
    ``INTER_NODE`` (``ib-ndr``, ``ib-hdr``, ``roce-400``, ``roce-200``, ``roce-100``).

    Example::

        machine("a100", network="nvlink3+roce-100", compute_efficiency=0.5)
    """
    if isinstance(gpu, Machine):
        base = gpu
    else:
        key = gpu.lower()
        if key not in GPUS:
            raise ConfigError(f"unknown GPU preset {gpu!r}; use one of {', '.join(sorted(GPUS))}")
        spec = GPUS[key].copy()
        base = Machine(intra_node_gbps=0.0, inter_node_gbps=0.0, **spec)
        base = _with_network(base, str(spec["network"]))
    if network is not None:
        base = _with_network(base, network)
    unknown = set(overrides) - set(Machine.__dataclass_fields__)
    if unknown:
        raise ConfigError(
            f"unknown machine constant(s) {', '.join(sorted(unknown))}; known: "
            + ", ".join(Machine.__dataclass_fields__)
        )
    precision = overrides.get("float32_matmul_precision")
    if precision is not None and precision not in FLOAT32_MATMUL_PRECISIONS:
        raise ConfigError(
            f"float32_matmul_precision must be one of {', '.join(FLOAT32_MATMUL_PRECISIONS)} "
            f"(as torch.set_float32_matmul_precision takes it), got {precision!r}"
        )
    return replace(base, **overrides)


def _with_network(m: Machine, network: str) -> Machine:
    intra, inter, mesh = m.intra_node_gbps, m.inter_node_gbps, m.intra_node_mesh
    for part in network.lower().split("+"):
        if part in INTRA_NODE:
            intra, mesh = INTRA_NODE[part], part in POINT_TO_POINT
        elif part in INTER_NODE:
            inter = INTER_NODE[part]
        else:
            known = ", ".join([*INTRA_NODE, *INTER_NODE])
            raise ConfigError(f"unknown network {part!r}; use {known} (joined by '+')")
    return replace(
        m, intra_node_gbps=intra, inter_node_gbps=inter, intra_node_mesh=mesh, network=network
    )
