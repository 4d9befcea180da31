"""A parameterised machine for the time model: GPU throughput and collective bandwidth.

Every constant can be overridden::

    m = machine("h100")                                   # H100 SXM, NVLink 4, InfiniBand NDR
    m = machine("a100", network="roce-200")               # another inter-node fabric
    m = machine("h100", compute_efficiency=0.45, inter_node_gbps=40.0)
    m = Machine(name="mine", tflops={"bfloat16": 500.0}, intra_node_gbps=200.0, ...)

Compute: a stretch of ``F`` FLOPs in dtype ``d`` takes
``F / (tflops[d] * 1e12 * compute_efficiency)`` seconds. Only the FLOPs the trace
counts (matrix multiplies, attention, convolutions) are timed; ``compute_efficiency``
(model FLOP utilisation of those kernels) absorbs the memory-bound operators.

CPU offload: a shard's copy to the device before its all-gather, and a gradient shard's
copy back after its reduction, take ``bytes / pcie_gbps``; the optimizer step runs on the
host at ``host_gbps``.

Collectives (ring algorithm) over ``N`` ranks moving ``S`` bytes (the unsharded
size; each rank sends and receives ``(N - 1) / N * S``)::

    all_gather, reduce_scatter:  latency(N) + (N - 1) / N * S / bandwidth(N)
    all_reduce:                  2 * latency(N) + 2 * (N - 1) / N * S / bandwidth(N)

``bandwidth(N)`` is ``intra_node_gbps`` (GB/s per GPU) when the ``N`` ranks fit
in one node (``N <= gpus_per_node``), else ``inter_node_gbps``: a ring that spans
nodes goes through each GPU's network link; both times ``comm_efficiency``.
``latency(N)`` is ``intra_node_latency_us`` or ``inter_node_latency_us`` times
``ceil(log2 N)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from fsdpviz.errors import ConfigError


@dataclass(frozen=True)
class Machine:
    """One GPU type in nodes of ``gpus_per_node``, with its intra- and inter-node links."""

    name: str
    tflops: dict[str, float]  # dense peak TFLOP/s per compute dtype
    memory_gib: float  # device memory
    hbm_gbps: float  # device memory bandwidth, GB/s (optimizer step estimate)
    intra_node_gbps: float  # per-GPU collective bandwidth inside a node, GB/s
    inter_node_gbps: float  # per-GPU network bandwidth across nodes, GB/s
    gpus_per_node: int = 8
    # CPU offload: host-to-device / device-to-host copies of shards and gradients (GB/s per
    # GPU, one direction, achieved with pinned memory) and the host memory bandwidth one rank's
    # optimizer step gets on the CPU (GB/s).
    pcie_gbps: float = 25.0
    host_gbps: float = 20.0
    intra_node_latency_us: float = 8.0
    inter_node_latency_us: float = 20.0
    compute_efficiency: float = 0.6
    comm_efficiency: float = 0.8
    network: str = ""

    def compute_seconds(self, flops: float, dtype: str | None) -> float:
        """Seconds for ``flops`` FLOPs computed in ``dtype`` (``"bfloat16"``, ...)."""
        if flops <= 0:
            return 0.0
        key = dtype if dtype in self.tflops else "float32"
        if key not in self.tflops:
            raise ConfigError(
                f"machine {self.name!r} has no throughput for {dtype!r}; pass "
                f"tflops={{{dtype!r}: ...}} to machine()"
            )
        return flops / (self.tflops[key] * 1e12 * self.compute_efficiency)

    def collective_seconds(self, kind: str, nbytes: float, ranks: int) -> float:
        """Seconds for an ``all_gather`` / ``reduce_scatter`` / ``all_reduce`` of ``nbytes``."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        inside = ranks <= self.gpus_per_node
        gbps = self.intra_node_gbps if inside else self.inter_node_gbps
        lat = self.intra_node_latency_us if inside else self.inter_node_latency_us
        steps = 2 if kind == "all_reduce" else 1
        moved = (ranks - 1) / ranks * nbytes
        return steps * (
            lat * 1e-6 * math.ceil(math.log2(ranks)) + moved / (gbps * 1e9 * self.comm_efficiency)
        )

    def copy_seconds(self, nbytes: float) -> float:
        """Seconds to copy ``nbytes`` between host and device memory (CPU offload)."""
        return nbytes / (self.pcie_gbps * 1e9) if nbytes > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Dense (no sparsity) peak throughput from the vendors' data sheets; float32 is the
# non-tensor-core rate (TF32 tensor cores are faster: set tflops["float32"] to use them).
GPUS: dict[str, dict[str, Any]] = {
    "h100": {
        "name": "H100 SXM 80GB",
        "tflops": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0, "float8_e4m3fn": 1979.0},
        "memory_gib": 80.0,
        "hbm_gbps": 3350.0,
        "pcie_gbps": 50.0,  # PCIe 5 x16: 64 GB/s per direction
        "network": "nvlink4+ib-ndr",
    },
    "h200": {
        "name": "H200 SXM 141GB",
        "tflops": {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0, "float8_e4m3fn": 1979.0},
        "memory_gib": 141.0,
        "hbm_gbps": 4800.0,
        "pcie_gbps": 50.0,
        "network": "nvlink4+ib-ndr",
    },
    "a100": {
        "name": "A100 SXM 80GB",
        "tflops": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
        "memory_gib": 80.0,
        "hbm_gbps": 2039.0,
        "network": "nvlink3+ib-hdr",
    },
    "l40s": {
        "name": "L40S 48GB",
        "tflops": {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6, "float8_e4m3fn": 733.0},
        "memory_gib": 48.0,
        "hbm_gbps": 864.0,
        "network": "pcie4+roce-200",
    },
}
GPUS["h100-sxm"] = GPUS["h100"]
GPUS["a100-80gb"] = GPUS["a100"]

# Achievable per-GPU bandwidth (GB/s, one direction) of each link, before comm_efficiency.
INTRA_NODE = {
    "nvlink4": 450.0,  # H100/H200 NVLink 4 through NVSwitch: 900 GB/s bidirectional
    "nvlink3": 300.0,  # A100 NVLink 3 through NVSwitch: 600 GB/s bidirectional
    "pcie5": 64.0,
    "pcie4": 32.0,
}
INTER_NODE = {
    "ib-ndr": 50.0,  # InfiniBand NDR, 400 Gb/s per GPU
    "ib-hdr": 25.0,  # InfiniBand HDR, 200 Gb/s per GPU
    "roce-400": 50.0,  # RoCE, 400 Gb/s per GPU
    "roce-200": 25.0,
    "roce-100": 12.5,
}


def machine(gpu: str | Machine = "h100", network: str | None = None, **overrides: Any) -> Machine:
    """A preset (``"h100"``, ``"h200"``, ``"a100"``, ``"l40s"``) with any constant overridden.

    ``network`` is ``"<intra>+<inter>"`` or just one of them, from
    ``INTRA_NODE`` (``nvlink4``, ``nvlink3``, ``pcie5``, ``pcie4``) and
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
        spec = dict(GPUS[key])
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
    return replace(base, **overrides)


def _with_network(m: Machine, network: str) -> Machine:
    intra, inter = m.intra_node_gbps, m.inter_node_gbps
    for part in network.lower().split("+"):
        if part in INTRA_NODE:
            intra = INTRA_NODE[part]
        elif part in INTER_NODE:
            inter = INTER_NODE[part]
        else:
            known = ", ".join([*INTRA_NODE, *INTER_NODE])
            raise ConfigError(f"unknown network {part!r}; use {known} (joined by '+')")
    return replace(m, intra_node_gbps=intra, inter_node_gbps=inter, network=network)
