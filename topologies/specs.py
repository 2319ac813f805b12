"""A machine as plain data: its device, node, network and collective tuning, in SI units.

These dataclasses are what ``load_machine`` (``topologies.machine``) returns
and what every other layer reads, so they hold numbers only: no file format,
no validation (the loader's job) and no graph code (``topologies.networks``
builds graphs and links from them, so it depends on this module and not
the other way round). Keeping them
apart lets the simulator, the search and the fitter import the shapes of a
machine without the loader, and lets a reader see in one page what a machine
is. The words a machine file may use (protocols, layouts, routings, node
switch kinds, collective kinds) are listed here too, beside the fields that
hold them.

A network has no per-switch or per-NIC latency field: the simulator charges a
transfer's latency from the collective tuning model alone (``[collectives]``:
NCCL's base and per-hop latencies, which include the NIC and switch hops), so
such a field would be parsed and settable but change nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from topologies.overrides import Override
from topologies.schema import Sourced

LAYOUTS = ("NN", "NT", "TN")
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("ll", "ll128", "simple")
ROUTINGS = ("minimal", "adaptive")
# The collective kinds a machine file may tune (``[collectives.kind_*]``): the schedule IR's kinds, which
# twin.ir defines as well (tests/test_topologies_layout.py keeps the two equal; the machine layer does not
# import the twin).
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "shift")
# Switch kinds a node may hold -> the link kind of its ports. "loopback": the ranks of one
# host talking through the OS (gloo over TCP loopback), as `twin calibrate` describes a host.
NODE_SWITCHES = {"nvswitch": "nvlink", "loopback": "loopback"}


@dataclass(frozen=True)
class GemmMeasurement:
    """One GEMM timed on the device (``[[device.gemm_measured]]``): its shape, its layout and the rate it ran at.

    Where a machine file has such measurements, the compute model runs a GEMM
    at the rate measured for the nearest measured shape, carried to its own
    shape by the shape model (twin.sim.compute): a measurement at the shapes a
    run uses replaces the tile/wave/k-loop estimates there."""

    m: int
    n: int
    k: int
    layout: str  # "NN", "NT" or "TN"
    flop_per_s: float
    batch: int = 1  # products in one batched launch (unfused attention's score and context GEMMs)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as a process sees it (a GCD on MI250X)."""

    name: str
    peak_flop_per_s: float
    empirical_gemm_flop_per_s: float
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    compute_units: int
    gemm_tile_m: int
    gemm_tile_n: int
    gemm_k_half: float
    layout_efficiency: dict[str, float]  # "NN", "NT", "TN" -> rate relative to the best layout
    layout_penalty_min_dim: int  # layout_efficiency applies when min(m, n, k) >= this (1.0 below)
    attention_efficiency: float  # flash attention rate / empirical GEMM rate
    hbm_efficiency: float  # achieved / peak HBM bandwidth for streaming kernels
    comm_compute_slowdown: float  # fraction of compute rate lost while a collective runs (on a host whose ranks
    # share cores, only while it moves bytes: twin.sim.engine)
    kernel_overhead_s: float
    attention_overhead_s: float = 0.0  # fixed time per attention call beyond kernel_overhead_s (optional key)
    # The least time between two ops one rank's host thread issues (framework, Python, driver); 0: the host
    # always keeps ahead of the device. Optional key launch_interval_us; see twin.sim.engine's host model.
    launch_interval_s: float = 0.0
    gemm_measured: tuple[GemmMeasurement, ...] = ()  # GEMMs timed on this device (optional [[device.gemm_measured]])
    # How much of wave quantisation's idle time a GEMM pays (optional key gemm_wave_quantization): 1, all of it
    # (a grid of fixed tiles runs in waves of compute_units); 0, none (kernels that keep every unit busy, as
    # Hopper's persistent cuBLAS kernels were measured to on an H200: docs/gpu-h200.md).
    gemm_wave_quantization: float = 1.0
    # FP8 tensor-core GEMMs (optional keys peak_fp8_tflop_per_s, empirical_gemm_fp8_tflop_per_s, both or neither):
    # the rates of a plan's fp8=1 linears (Transformer Engine); 0 where the file gives none, and such a plan is
    # refused on it (twin.build).
    peak_fp8_flop_per_s: float = 0.0
    empirical_gemm_fp8_flop_per_s: float = 0.0


@dataclass(frozen=True)
class NodeLink:
    """Direct links between two local devices; bandwidth is the pair's peak per direction."""

    a: int
    b: int
    count: int
    bw_bytes_per_s: float
    kind: str


@dataclass(frozen=True)
class NicSpec:
    """One NIC of a node: the device it hangs off and its port."""

    index: int
    attach_gpu: int
    bw_bytes_per_s: float  # port peak per direction
    attach_bw_bytes_per_s: float  # device <-> NIC path peak per direction


@dataclass(frozen=True)
class NodeSwitch:
    """A switch inside the node that every local device has one port on (NVSwitch).

    Modelled as one vertex: each device has an uplink and a downlink of
    ``bw_bytes_per_s`` to it, so device-to-device traffic crosses two links
    and a device's port, not a pair's link, is the bottleneck. The switch
    fabric itself (six NVSwitch chips on a DGX A100) is taken to be
    non-blocking.
    """

    kind: str  # graph vertex name, e.g. "nvswitch"
    link_kind: str  # kind of the device <-> switch links, e.g. "nvlink"
    links_per_gpu: int  # physical links bundled in each device's port
    bw_bytes_per_s: float  # per device port, peak per direction


@dataclass(frozen=True)
class NodeSpec:
    """One node: its devices, the direct links between them, its NICs and its optional node switch."""

    gpus_per_node: int
    links: tuple[NodeLink, ...]
    nics: tuple[NicSpec, ...]  # sorted by index, indices 0..n-1
    link_efficiency: dict[str, float]  # link kinds + "nic" + "attach" (+ optional "network")
    switch: NodeSwitch | None = None
    # Cores the node's devices share (a CPU host whose ranks are processes); 0: each device computes on its
    # own (GPUs). The device's compute rates are then those of every device computing at once (twin calibrate
    # measures them so), and one computing while fewer others do runs faster (twin.sim.compute_unit).
    shared_cores: float = 0.0
    # With shared cores: how far the last of the node's ranks lags their mean at a synchronising collective,
    # per second of compute before it, while more ranks compute than there are cores (the OS time-slices
    # them unevenly); twin calibrate measures it. Compute then runs 1 / (1 + skew) of the fair share, so that
    # a phase ends when its last rank does (twin.sim.compute_unit.NodeCores).
    timeslice_skew: float = 0.0
    # With shared cores: how many times longer a transfer takes while computing ranks hold every core
    # (gloo's threads wait for cores the compute holds); twin calibrate measures it on a 64 MB all-reduce.
    comm_stretch_under_compute: float = 1.0
    # With shared cores: the pace, over its pace alone, of a transfer's latency while its own ranks compute and
    # computing ranks hold every core (0: it waits for them to stop); twin calibrate measures it on a small
    # all-reduce issued before GEMMs. None (not measured): the latency is stretched as the bytes are. Set, the
    # simulator moves a transfer's bytes first and its latency after (twin.sim.engine; docs/fit.md).
    comm_latency_pace_under_compute: float | None = None
    # With shared cores: the part of the last rank's lag (timeslice_skew's) that does not grow with the compute
    # before the synchronisation, reached once more ranks than cores have computed `timeslice_lag_after_s`
    # (linearly from 0 below it); twin calibrate measures both (executor.calibrate_sharing.Lag).
    timeslice_lag_s: float = 0.0
    timeslice_lag_after_s: float = 0.0
    # With shared cores: the share of a core a rank takes while its transfers move bytes and it computes
    # nothing (gloo's threads copy and reduce on the cores; a rank that waits for the others takes none), from
    # the ranks computing beside it; twin calibrate measures it (executor.calibrate_sharing.mover_share).
    comm_core_share: float = 0.0
    # With shared cores: the longest phase of compute the lag's line above was fitted on (inf, not measured: the
    # line goes on), and how fast the lag grows per second of a longer phase past it (twin calibrate measures it
    # on longer phases; 0: held at the span's; twin.sim.compute_unit.timeslice_lag_s).
    timeslice_lag_span_s: float = math.inf
    timeslice_skew_beyond_span: float = 0.0

    @property
    def network_link_efficiency(self) -> float:
        """Switch-to-switch links: the "network" entry where given, else the NIC's."""
        return self.link_efficiency.get("network", self.link_efficiency["nic"])


@dataclass(frozen=True)
class DragonflySpec:
    """A Slingshot-style dragonfly (see ``topologies.networks.dragonfly``)."""

    kind: ClassVar[str] = "dragonfly"
    nodes_per_group: int
    switches_per_group: int
    endpoint_ports_per_switch: int
    global_links_per_group_pair: int
    link_bw_bytes_per_s: float
    n_groups: int
    routing: str = "minimal"  # "minimal" | "adaptive" (see topologies.networks.dragonfly)

    @property
    def max_nodes(self) -> int:
        return self.n_groups * self.nodes_per_group

    def describe(self) -> str:
        return f"dragonfly, {self.n_groups} groups x {self.nodes_per_group} nodes, {self.routing} routing"


@dataclass(frozen=True)
class FatTreeSpec:
    """A rail-optimized two-level fat tree (see ``topologies.networks.fattree``).

    ``nodes_per_group`` and ``n_groups`` name the leaf groups (scalable
    units) in the dragonfly's terms, so code that prints a network's groups
    works on both kinds.
    """

    kind: ClassVar[str] = "fat_tree"
    nodes_per_leaf_group: int  # nodes whose NIC k shares leaf switch k (a scalable unit)
    n_nodes: int
    link_bw_bytes_per_s: float
    oversubscription: float  # leaf downlink / uplink bandwidth; 1 = full bisection

    @property
    def max_nodes(self) -> int:
        return self.n_nodes

    @property
    def nodes_per_group(self) -> int:
        return self.nodes_per_leaf_group

    @property
    def n_groups(self) -> int:
        return -(-self.n_nodes // self.nodes_per_leaf_group)

    @property
    def leaf_uplink_bw_bytes_per_s(self) -> float:
        """Peak per direction of one leaf switch's uplinks, all together."""
        return self.nodes_per_leaf_group * self.link_bw_bytes_per_s / self.oversubscription

    def describe(self) -> str:
        return (f"fat_tree, {self.n_groups} leaf groups x {self.nodes_per_leaf_group} nodes, "
                f"oversubscription {self.oversubscription:g}")


# Both kinds offer kind, max_nodes, nodes_per_group, n_groups, link_bw_bytes_per_s and describe().
NetworkSpec = DragonflySpec | FatTreeSpec


@dataclass(frozen=True)
class CollectiveTuning:
    """NCCL/RCCL's latency/bandwidth tuning model inputs (NVIDIA/nccl tuning.cc)."""

    protocols: tuple[str, ...]  # protocols the library may use on this machine
    base_latency_s: dict[tuple[str, str], float]  # (algorithm, protocol)
    intra_hop_latency_s: dict[str, float]  # per protocol
    inter_hop_latency_s: dict[str, float]  # per protocol
    protocol_bw_fraction: dict[str, float]  # per protocol
    # Optional per collective kind (a library whose kinds differ, e.g. gloo's reduce-scatter):
    kind_latency_s: dict[str, float] = field(default_factory=dict)  # added to the algorithm's latency
    kind_bw_fraction: dict[str, float] = field(default_factory=dict)  # achieved / fitted port bandwidth
    # Optional per collective kind: the library's achieved fraction of a NIC port's peak where it was measured
    # apart from node.link_efficiency.nic (RCCL's all-gathers across Frontier's NICs reach twice its all-reduces'
    # rate). Only the injection and ejection links of the NICs take it; every other link keeps its kind's.
    nic_efficiency: dict[str, float] = field(default_factory=dict)
    # Optional per protocol: a point-to-point transfer's latency inside a node where it was measured (twin
    # calibrate on a CPU host: a gloo send is one message, far below a ring's base latency); absent, and for a
    # transfer between nodes: the ring's base plus one hop.
    p2p_latency_s: dict[str, float] = field(default_factory=dict)

    def kind_fraction(self, kind: str) -> float:
        return self.kind_bw_fraction.get(kind, 1.0)


@dataclass(frozen=True)
class Machine:
    """A whole machine, as ``load_machine`` reads it from its file (with any ``--set`` overrides applied)."""

    name: str
    description: str
    device: DeviceSpec
    node: NodeSpec
    network: NetworkSpec
    collectives: CollectiveTuning
    sources: dict[str, Sourced]  # dotted key path -> number as written, with provenance
    path: str
    overrides: tuple[Override, ...] = ()  # (dotted path, value) set on the command line over the file

    @property
    def max_nodes(self) -> int:
        return self.network.max_nodes

    @property
    def max_gpus(self) -> int:
        return self.max_nodes * self.node.gpus_per_node

