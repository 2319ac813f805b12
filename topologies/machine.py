"""A machine: its device, node, network and collective tuning, in SI units.

A machine is a TOML file in this package (frontier.toml, perlmutter.toml,
alps.toml, dgx-a100.toml) or anywhere on disk: a new machine is a new file,
not new code.
The files use human units named in each key (``hbm_bw_gb_per_s``,
``kernel_overhead_us``); ``load_machine`` converts them once, here, so that
everything downstream works in bytes, seconds and flop/s (1 GB = 1e9 bytes).
The file's numbers with their sources stay available in ``Machine.sources``.

A node is devices joined by direct links (``[[node.links]]``) and/or a node
switch every device has a port on (``[node.switch]``, NVSwitch). The network
``kind`` picks a spec and a module placing its switches (``NETWORK_KINDS``):
"dragonfly" (``DragonflySpec``, ``topologies.dragonfly``) or "fat_tree"
(``FatTreeSpec``, ``topologies.fattree``). Both specs offer ``kind``,
``max_nodes``, ``nodes_per_group``, ``n_groups``, ``link_bw_bytes_per_s``
and ``describe()``.

A network has no per-switch or per-NIC latency field: the simulator charges a
transfer's latency from the collective tuning model alone (``[collectives]``:
NCCL's base and per-hop latencies, which include the NIC and switch hops), so
such a field would be parsed and settable but change nothing.

``node_graph`` and ``network_graph`` return networkx graphs for inspection
and figures; the simulator's hot path uses ``topologies.fabric.Fabric``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import networkx as nx

from topologies import dragonfly, fattree
from topologies.schema import Fields, Sourced
from topologies.overrides import Override, apply_overrides
from twin.errors import TwinError
from twin.ir import COLLECTIVE_KINDS

__all__ = [
    "Sourced", "GemmMeasurement", "DeviceSpec", "NodeLink", "NicSpec", "NodeSwitch", "NodeSpec", "NetworkSpec",
    "DragonflySpec", "FatTreeSpec", "NETWORK_KINDS", "CollectiveTuning", "Machine",
    "load_machine", "list_machines",
]

_DIR = Path(__file__).resolve().parent
GB, TFLOP, US = 1e9, 1e12, 1e-6
LAYOUTS = ("NN", "NT", "TN")
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("ll", "ll128", "simple")


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
    tn_penalty_min_dim: int  # the TN penalty applies when min(m, n, k) >= this
    attention_efficiency: float  # flash attention rate / empirical GEMM rate
    hbm_efficiency: float  # achieved / peak HBM bandwidth for streaming kernels
    comm_compute_slowdown: float  # fraction of compute rate lost while a collective runs
    kernel_overhead_s: float
    attention_overhead_s: float = 0.0  # fixed time per attention call beyond kernel_overhead_s (optional key)
    # The least time between two ops one rank's host thread issues (framework, Python, driver); 0: the host
    # always keeps ahead of the device. Optional key launch_interval_us; see twin.sim.engine's host model.
    launch_interval_s: float = 0.0
    gemm_measured: tuple[GemmMeasurement, ...] = ()  # GEMMs timed on this device (optional [[device.gemm_measured]])


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
    index: int
    attach_gpu: int
    bw_bytes_per_s: float  # port peak per direction
    attach_bw_bytes_per_s: float  # device <-> NIC path peak per direction


# Switch kinds a node may hold -> the link kind of its ports. "loopback": the ranks of one
# host talking through the OS (gloo over TCP loopback), as `twin calibrate` describes a host.
NODE_SWITCHES = {"nvswitch": "nvlink", "loopback": "loopback"}


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
    gpus_per_node: int
    links: tuple[NodeLink, ...]
    nics: tuple[NicSpec, ...]  # sorted by index, indices 0..n-1
    link_efficiency: dict[str, float]  # link kinds + "nic" + "attach" (+ optional "network")

    @property
    def network_link_efficiency(self) -> float:
        """Switch-to-switch links: the "network" entry where given, else the NIC's."""
        return self.link_efficiency.get("network", self.link_efficiency["nic"])
    switch: NodeSwitch | None = None


ROUTINGS = ("minimal", "adaptive")


@dataclass(frozen=True)
class DragonflySpec:
    """A Slingshot-style dragonfly (see ``topologies.dragonfly``)."""

    kind: ClassVar[str] = "dragonfly"
    nodes_per_group: int
    switches_per_group: int
    endpoint_ports_per_switch: int
    global_links_per_group_pair: int
    link_bw_bytes_per_s: float
    n_groups: int
    routing: str = "minimal"  # "minimal" | "adaptive" (see topologies.fabric)

    @property
    def max_nodes(self) -> int:
        return self.n_groups * self.nodes_per_group

    def describe(self) -> str:
        return f"dragonfly, {self.n_groups} groups x {self.nodes_per_group} nodes, {self.routing} routing"


@dataclass(frozen=True)
class FatTreeSpec:
    """A rail-optimized two-level fat tree (see ``topologies.fattree``).

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

    def kind_fraction(self, kind: str) -> float:
        return self.kind_bw_fraction.get(kind, 1.0)


@dataclass(frozen=True)
class Machine:
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

    def node_graph(self) -> nx.DiGraph:
        """One node: ("gpu", i), ("nic", k) and, with a node switch, (switch.kind, 0).

        Each link is two directed edges. Attributes: bw_bytes_per_s (peak per
        direction), kind, count (physical links bundled). A node switch has one
        edge each way per device: devices talk through it, not directly.
        """
        g = nx.DiGraph(name=f"{self.name} node")
        g.add_nodes_from(("gpu", i) for i in range(self.node.gpus_per_node))
        g.add_nodes_from(("nic", nic.index) for nic in self.node.nics)
        for link in self.node.links:
            attrs = dict(bw_bytes_per_s=link.bw_bytes_per_s, kind=link.kind, count=link.count)
            g.add_edge(("gpu", link.a), ("gpu", link.b), **attrs)
            g.add_edge(("gpu", link.b), ("gpu", link.a), **attrs)
        sw = self.node.switch
        if sw is not None:
            attrs = dict(bw_bytes_per_s=sw.bw_bytes_per_s, kind=sw.link_kind, count=sw.links_per_gpu)
            for i in range(self.node.gpus_per_node):
                g.add_edge(("gpu", i), (sw.kind, 0), **attrs)
                g.add_edge((sw.kind, 0), ("gpu", i), **attrs)
        for nic in self.node.nics:
            attrs = dict(bw_bytes_per_s=nic.attach_bw_bytes_per_s, kind="attach", count=1)
            g.add_edge(("gpu", nic.attach_gpu), ("nic", nic.index), **attrs)
            g.add_edge(("nic", nic.index), ("gpu", nic.attach_gpu), **attrs)
        return g

    def network_graph(self, n_nodes: int) -> nx.DiGraph:
        """The first ``n_nodes`` nodes and every switch they use.

        Node vertices are the ``node_graph`` ones with the node inserted:
        ("gpu", node, i), ("nic", node, k), ("nvswitch", node, 0). The
        network's switches and links come from its kind's module, which also
        gives ``Fabric`` its link table, so the two match link for link:
        ``topologies.dragonfly`` (("switch", group, s); "nic", "local",
        "global" edges) or ``topologies.fattree`` (("leaf", unit, rail),
        ("spine", 0); "nic", "spine_pool" edges). Attributes as in
        ``node_graph``.
        """
        if not 1 <= n_nodes <= self.max_nodes:
            raise TwinError(f"n_nodes: {n_nodes} is outside 1..{self.max_nodes} for machine '{self.name}'")
        g = nx.DiGraph(name=f"{self.name} {n_nodes} nodes")
        local = self.node_graph()
        for n in range(n_nodes):
            g.add_nodes_from((kind, n, i) for kind, i in local.nodes)
            for (ku, u), (kv, v), attrs in local.edges(data=True):
                g.add_edge((ku, n, u), (kv, n, v), **attrs)
        NETWORK_KINDS[self.network.kind].add_network(g, self.network, self.node.nics, n_nodes)
        return g


# ---------------------------------------------------------------- loading


def list_machines() -> list[str]:
    """Names of the machine files shipped in this package."""
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def machine_file(name_or_path: str) -> Path:
    """The file a --machine value names (a bare name is a file of this package), without loading it;
    a one-line TwinError when there is none."""
    return _resolve(name_or_path)


def _resolve(name_or_path: str) -> Path:
    looks_like_path = name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path
    known = ", ".join(list_machines())
    if looks_like_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise TwinError(f"machine: file '{name_or_path}' not found; pass an existing .toml file or one of {known}")
        return path
    path = _DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise TwinError(f"machine: unknown machine '{name_or_path}'; known: {known} (or a path to a .toml file)")
    return path


def load_machine(name_or_path: str, overrides: tuple[Override, ...] = ()) -> Machine:
    """Load a machine by bare name (a file of this package) or by path, with what-if `overrides`."""
    path = _resolve(name_or_path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise TwinError(f"machine: cannot read '{path}': {e.strerror}; check the path and permissions") from e
    except UnicodeDecodeError as e:
        raise TwinError(f"{path}: not a text file (byte {e.start} is not UTF-8); give a machine .toml file") from None
    except tomllib.TOMLDecodeError as e:
        msg = " ".join(str(e).split())
        raise TwinError(f"{path}: invalid TOML ({msg}); fix the syntax") from e
    apply_overrides(data, overrides, path.name)
    sources: dict[str, Sourced] = {}
    top = Fields(data, "", str(path) + (" (with --set)" if overrides else ""), sources)
    meta = top.table("machine")
    name, description = meta.text("name"), meta.text("description")
    meta.finish()
    device = _device(top.table("device"))
    node = _node(top.table("node"))
    network = _network(top.table("network"), node)
    collectives = _collectives(top.table("collectives"))
    top.finish()
    return Machine(name, description, device, node, network, collectives, sources, str(path),
                   tuple(dict(overrides).items()))


def _device(f: Fields) -> DeviceSpec:
    lay = f.table("layout_efficiency")
    layout = {k.upper(): lay.number(k, "fraction") for k in ("nn", "nt", "tn")}
    lay.finish()
    peak = f.number("peak_bf16_tflop_per_s") * TFLOP
    spec = DeviceSpec(
        name=f.text("name"),
        peak_flop_per_s=peak,
        empirical_gemm_flop_per_s=f.number("empirical_gemm_bf16_tflop_per_s") * TFLOP,
        hbm_bytes=f.number("hbm_gb") * GB,
        hbm_bw_bytes_per_s=f.number("hbm_bw_gb_per_s") * GB,
        compute_units=f.integer("compute_units"),
        gemm_tile_m=f.integer("gemm_tile_m"),
        gemm_tile_n=f.integer("gemm_tile_n"),
        gemm_k_half=f.number("gemm_k_half", "nonneg"),
        layout_efficiency=layout,
        tn_penalty_min_dim=f.integer("tn_penalty_min_dim", "nonneg"),
        attention_efficiency=f.number("attention_efficiency", "fraction"),
        hbm_efficiency=f.number("hbm_efficiency", "fraction"),
        comm_compute_slowdown=f.number("comm_compute_slowdown", "nonneg"),
        kernel_overhead_s=f.number("kernel_overhead_us", "nonneg") * US,
        attention_overhead_s=f.number("attention_overhead_us", "nonneg") * US if f.has("attention_overhead_us") else 0.0,
        launch_interval_s=f.number("launch_interval_us", "nonneg") * US if f.has("launch_interval_us") else 0.0,
        gemm_measured=_gemm_measured(f.tables("gemm_measured"), peak),
    )
    if spec.empirical_gemm_flop_per_s > spec.peak_flop_per_s:
        f.fail("empirical_gemm_bf16_tflop_per_s", "exceeds peak_bf16_tflop_per_s; check both values")
    if spec.comm_compute_slowdown >= 1:
        f.fail("comm_compute_slowdown", "must be < 1 (a fraction of the compute rate)")
    f.finish()
    return spec


def _gemm_measured(entries: list[Fields], peak_flop_per_s: float) -> tuple[GemmMeasurement, ...]:
    """``[[device.gemm_measured]]``: m, n, k (plain integers under the entry's source), layout, tflop_per_s."""
    out: list[GemmMeasurement] = []
    seen: set[tuple[int, int, int, str]] = set()
    for g in entries:
        m, n, k = (g.structure(key, "positive") for key in ("m", "n", "k"))
        layout = g.text("layout").upper()
        if layout not in LAYOUTS:
            g.fail("layout", f"is {layout.lower()!r}; use one of {', '.join(x.lower() for x in LAYOUTS)}")
        if (m, n, k, layout) in seen:
            g.fail("m", f"repeats the measurement of {m}x{n}x{k} {layout.lower()}; keep one entry per shape and layout")
        seen.add((m, n, k, layout))
        rate = g.number("tflop_per_s") * TFLOP
        if rate > peak_flop_per_s:
            g.fail("tflop_per_s", f"is {rate / TFLOP:g}, above the device peak {peak_flop_per_s / TFLOP:g}; "
                                  "check the timing (a GEMM cannot beat the peak)")
        out.append(GemmMeasurement(m, n, k, layout, rate))
        g.finish()
    return tuple(out)


def _node(f: Fields) -> NodeSpec:
    n = f.integer("gpus_per_node")
    links: list[NodeLink] = []
    seen: set[tuple[int, int]] = set()
    for lf in f.tables("links"):
        a, b = lf.structure("a"), lf.structure("b")
        for key, v in (("a", a), ("b", b)):
            if v >= n:
                lf.fail(key, f"is GPU {v} but gpus_per_node is {n}; use 0..{n - 1}")
        if a == b or (min(a, b), max(a, b)) in seen:
            lf.fail("b", f"link {a}-{b} is a self-loop or a duplicate; list each GPU pair once")
        seen.add((min(a, b), max(a, b)))
        links.append(NodeLink(a, b, lf.structure("count", "positive"),
                              lf.number("bw_per_direction_gb_per_s") * GB, lf.text("kind")))
        lf.finish()
    nics: list[NicSpec] = []
    for nf in f.tables("nics"):
        index, gpu = nf.structure("index"), nf.structure("attach_gpu")
        if gpu >= n:
            nf.fail("attach_gpu", f"is GPU {gpu} but gpus_per_node is {n}; use 0..{n - 1}")
        nics.append(NicSpec(index, gpu, nf.number("bw_per_direction_gb_per_s") * GB,
                            nf.number("attach_bw_per_direction_gb_per_s") * GB))
        nf.finish()
    nics.sort(key=lambda x: x.index)
    if [x.index for x in nics] != list(range(len(nics))):
        f.fail("nics", f"indices are {[x.index for x in nics]}; number the NICs 0..{len(nics) - 1}")
    switch = _switch(f.table("switch")) if f.has("switch") else None
    ef = f.table("link_efficiency")
    eff = {k: ef.number(k, "fraction") for k in ef.keys()}
    kinds = {lk.kind for lk in links} | {"nic", "attach"} | ({switch.link_kind} if switch else set())
    for kind in sorted(kinds):
        if kind not in eff:
            ef.fail(kind, f'is missing; add {kind} = {{ value = 0.8, estimate = "..." }} (achieved/peak)')
    ef.finish()
    if switch is None:
        _check_connected(f, n, links)
    f.finish()
    return NodeSpec(n, tuple(links), tuple(nics), eff, switch)


def _switch(f: Fields) -> NodeSwitch:
    """``[node.switch]``: a switch every device has one port on (NVSwitch)."""
    kind = f.text("kind")
    if kind not in NODE_SWITCHES:
        f.fail("kind", f"is '{kind}'; use one of {', '.join(repr(k) for k in NODE_SWITCHES)}")
    sw = NodeSwitch(kind, NODE_SWITCHES[kind], f.integer("links_per_gpu"),
                    f.number("bw_per_direction_gb_per_s") * GB)
    f.finish()
    return sw


def _check_connected(f: Fields, n: int, links: list[NodeLink]) -> None:
    """Every pair of local devices must be joined by some path of links."""
    reach, todo = {0}, [0]
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for lk in links:
        adj[lk.a].add(lk.b)
        adj[lk.b].add(lk.a)
    while todo:
        for m in adj[todo.pop()] - reach:
            reach.add(m)
            todo.append(m)
    if len(reach) < n:
        lost = min(set(range(n)) - reach)
        f.fail("links", f"leave GPU {lost} unreachable from GPU 0; add a [[node.links]] entry for it")


def _network(f: Fields, node: NodeSpec) -> NetworkSpec:
    kind = f.text("kind")
    if kind not in _NETWORK_READERS:
        f.fail("kind", f"is '{kind}'; use one of {', '.join(repr(k) for k in _NETWORK_READERS)}")
    net = _NETWORK_READERS[kind](f, node)
    f.finish()
    return net


def _dragonfly(f: Fields, node: NodeSpec) -> DragonflySpec:
    net = DragonflySpec(
        nodes_per_group=f.integer("nodes_per_group"),
        switches_per_group=f.integer("switches_per_group"),
        endpoint_ports_per_switch=f.integer("endpoint_ports_per_switch"),
        global_links_per_group_pair=f.integer("global_links_per_group_pair"),
        link_bw_bytes_per_s=f.number("link_bw_per_direction_gb_per_s") * GB,
        n_groups=f.integer("n_groups"),
        routing=f.text("routing") if f.has("routing") else "minimal",
    )
    if net.routing not in ROUTINGS:
        f.fail("routing", f"is '{net.routing}'; use one of {', '.join(ROUTINGS)}")
    need = dragonfly.switches_needed(net, len(node.nics))
    if need > net.switches_per_group:
        f.fail("switches_per_group", f"is {net.switches_per_group} but {net.nodes_per_group} nodes x "
               f"{len(node.nics)} NICs need {need} switches of {net.endpoint_ports_per_switch} "
               "endpoint ports; raise it")
    if net.global_links_per_group_pair > net.switches_per_group:
        f.fail("global_links_per_group_pair", "exceeds switches_per_group; each link of a pair needs its own switch")
    return net


def _fat_tree(f: Fields, node: NodeSpec) -> FatTreeSpec:
    net = FatTreeSpec(
        nodes_per_leaf_group=f.integer("nodes_per_leaf_group"),
        n_nodes=f.integer("n_nodes"),
        link_bw_bytes_per_s=f.number("link_bw_per_direction_gb_per_s") * GB,
        oversubscription=f.number("oversubscription"),
    )
    if net.oversubscription < 1:
        f.fail("oversubscription", f"is {net.oversubscription:g}; use >= 1 (1 = full bisection, 2 = half)")
    if not node.nics:
        f.fail("kind", "is \"fat_tree\" but the node has no NIC; add [[node.nics]] entries (one rail each)")
    return net


_NETWORK_READERS = {"dragonfly": _dragonfly, "fat_tree": _fat_tree}
# Network kind -> the module placing its switches (graph, Fabric link table).
NETWORK_KINDS = {"dragonfly": dragonfly, "fat_tree": fattree}


def _per_protocol(f: Fields, allowed: tuple[str, ...], check: str, scale: float) -> dict[str, float]:
    out = {k: f.number(k, check) * scale for k in f.keys()}
    for k in out:
        if k not in PROTOCOLS:
            f.fail(k, f"is not a protocol; use {', '.join(PROTOCOLS)}")
    for k in allowed:
        if k not in out:
            f.fail(k, "is missing for an allowed protocol; add it")
    f.finish()
    return out


def _collectives(f: Fields) -> CollectiveTuning:
    pf = f.table("protocols")
    allowed = pf.texts("allowed")
    for p in allowed:
        if p not in PROTOCOLS:
            pf.fail("allowed", f"lists '{p}'; use some of {', '.join(PROTOCOLS)}")
    pf.finish()
    bf = f.table("base_latency_us")
    base: dict[tuple[str, str], float] = {}
    for algo in ALGORITHMS:
        for proto, value in _per_protocol(bf.table(algo), allowed, "nonneg", US).items():
            base[(algo, proto)] = value
    bf.finish()
    tuning = CollectiveTuning(
        protocols=allowed,
        base_latency_s=base,
        intra_hop_latency_s=_per_protocol(f.table("intra_hop_latency_us"), allowed, "nonneg", US),
        inter_hop_latency_s=_per_protocol(f.table("inter_hop_latency_us"), allowed, "nonneg", US),
        protocol_bw_fraction=_per_protocol(f.table("protocol_bw_fraction"), allowed, "fraction", 1.0),
        kind_latency_s=_per_kind(f, "kind_latency_us", "nonneg", US),
        kind_bw_fraction=_per_kind(f, "kind_bw_fraction", "fraction", 1.0),
    )
    f.finish()
    return tuning


def _per_kind(f: Fields, key: str, check: str, scale: float) -> dict[str, float]:
    """An optional table of numbers per collective kind (absent: the kinds are alike)."""
    if not f.has(key):
        return {}
    t = f.table(key)
    out = {k: t.number(k, check) * scale for k in t.keys()}
    for k in out:
        if k not in COLLECTIVE_KINDS:
            t.fail(k, f"is not a collective kind; use {', '.join(COLLECTIVE_KINDS)}")
    t.finish()
    return out
