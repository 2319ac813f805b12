"""Reading a machine file: TOML in human units -> a checked ``Machine`` in SI units.

A machine is a TOML file in this package (frontier.toml, perlmutter.toml,
alps.toml, dgx-a100.toml, ...) or anywhere on disk: a new machine is a new
file, not new code. The files use human units named in each key
(``hbm_bw_gb_per_s``, ``kernel_overhead_us``); ``load_machine`` converts them
once, here, so that everything downstream works in bytes, seconds and flop/s
(1 GB = 1e9 bytes). The file's numbers with their sources stay available in
``Machine.sources``. Every check a file must pass lives here too, and each
failure is a one-line ``InputError`` naming the file, the field and the fix
(``topologies.schema`` reads the numbers; ``topologies.overrides`` applies
``--set`` values first).

A node is devices joined by direct links (``[[node.links]]``) and/or a node
switch every device has a port on (``[node.switch]``, NVSwitch). The network
``kind`` picks a spec and a module placing its switches (``NETWORK_KINDS``):
"dragonfly" (``DragonflySpec``, ``topologies.networks.dragonfly``) or
"fat_tree" (``FatTreeSpec``, ``topologies.networks.fattree``).

The dataclasses a file becomes are in ``topologies.specs``; they are
importable from here as well, as they always were.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from topologies.errors import InputError
from topologies.networks import NETWORK_KINDS, dragonfly
from topologies.overrides import Override, apply_overrides
from topologies.schema import Fields, Sourced
from topologies.specs import (
    ALGORITHMS, COLLECTIVE_KINDS, LAYOUTS, NODE_SWITCHES, PROTOCOLS, ROUTINGS, CollectiveTuning, DeviceSpec,
    DragonflySpec, FatTreeSpec, GemmMeasurement, Machine, NetworkSpec, NicSpec, NodeLink, NodeSpec, NodeSwitch,
)

__all__ = [
    "Sourced", "GemmMeasurement", "DeviceSpec", "NodeLink", "NicSpec", "NodeSwitch", "NodeSpec", "NetworkSpec",
    "DragonflySpec", "FatTreeSpec", "NETWORK_KINDS", "CollectiveTuning", "Machine",
    "load_machine", "list_machines", "machine_file",
    "LAYOUTS", "ALGORITHMS", "PROTOCOLS", "ROUTINGS", "NODE_SWITCHES", "COLLECTIVE_KINDS", "GB", "TFLOP", "US",
]

_DIR = Path(__file__).resolve().parent
GB, TFLOP, US = 1e9, 1e12, 1e-6


def list_machines() -> list[str]:
    """Names of the machine files shipped in this package."""
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def machine_file(name_or_path: str) -> Path:
    """The file a --machine value names (a bare name is a file of this package), without loading it;
    a one-line InputError when there is none."""
    return _resolve(name_or_path)


def _resolve(name_or_path: str) -> Path:
    looks_like_path = name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path
    known = ", ".join(list_machines())
    if looks_like_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise InputError(f"machine: file '{name_or_path}' not found; pass an existing .toml file or one of {known}")
        return path
    path = _DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise InputError(f"machine: unknown machine '{name_or_path}'; known: {known} (or a path to a .toml file)")
    return path


def load_machine(name_or_path: str, overrides: tuple[Override, ...] = ()) -> Machine:
    """Load a machine by bare name (a file of this package) or by path, with what-if `overrides`."""
    path = _resolve(name_or_path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise InputError(f"machine: cannot read '{path}': {e.strerror}; check the path and permissions") from e
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a text file (byte {e.start} is not UTF-8); give a machine .toml file") from None
    except tomllib.TOMLDecodeError as e:
        msg = " ".join(str(e).split())
        raise InputError(f"{path}: invalid TOML ({msg}); fix the syntax") from e
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
    if f.has("tn_penalty_min_dim"):  # its name until the penalty moved to the forward's layout (NT)
        f.fail("tn_penalty_min_dim", "was renamed layout_penalty_min_dim (it gates every layout's efficiency); "
               "rename the key")
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
        layout_penalty_min_dim=f.integer("layout_penalty_min_dim", "nonneg"),
        attention_efficiency=f.number("attention_efficiency", "fraction"),
        hbm_efficiency=f.number("hbm_efficiency", "fraction"),
        comm_compute_slowdown=f.number("comm_compute_slowdown", "nonneg"),
        kernel_overhead_s=f.number("kernel_overhead_us", "nonneg") * US,
        attention_overhead_s=f.number("attention_overhead_us", "nonneg") * US if f.has("attention_overhead_us") else 0.0,
        launch_interval_s=f.number("launch_interval_us", "nonneg") * US if f.has("launch_interval_us") else 0.0,
        gemm_measured=_gemm_measured(f.tables("gemm_measured"), peak),
        gemm_wave_quantization=f.number("gemm_wave_quantization", "share") if f.has("gemm_wave_quantization") else 1.0,
        **_fp8_rates(f),
    )
    if spec.empirical_gemm_flop_per_s > spec.peak_flop_per_s:
        f.fail("empirical_gemm_bf16_tflop_per_s", "exceeds peak_bf16_tflop_per_s; check both values")
    if spec.comm_compute_slowdown >= 1:
        f.fail("comm_compute_slowdown", "must be < 1 (a fraction of the compute rate)")
    f.finish()
    return spec


def _fp8_rates(f: Fields) -> dict[str, float]:
    """The device's FP8 GEMM peak and empirical rate, both given or neither (then 0: no fp8=1 plans on it)."""
    keys = ("peak_fp8_tflop_per_s", "empirical_gemm_fp8_tflop_per_s")
    given = [f.has(key) for key in keys]
    if not any(given):
        return {}
    if not all(given):
        missing = keys[given.index(False)]
        f.fail(missing, f"is missing; give both {keys[0]} and {keys[1]}, or neither")
    peak, empirical = (f.number(key) * TFLOP for key in keys)
    if empirical > peak:
        f.fail(keys[1], f"exceeds {keys[0]}; check both values")
    return {"peak_fp8_flop_per_s": peak, "empirical_gemm_fp8_flop_per_s": empirical}


def _gemm_measured(entries: list[Fields], peak_flop_per_s: float) -> tuple[GemmMeasurement, ...]:
    """``[[device.gemm_measured]]``: m, n, k (plain integers under the entry's source), layout, tflop_per_s, and
    batch (optional, 1 when absent: a batched launch of that many products)."""
    out: list[GemmMeasurement] = []
    seen: set[tuple[int, int, int, str, int]] = set()
    for g in entries:
        m, n, k = (g.structure(key, "positive") for key in ("m", "n", "k"))
        batch = g.structure("batch", "positive") if g.has("batch") else 1
        layout = g.text("layout").upper()
        if layout not in LAYOUTS:
            g.fail("layout", f"is {layout.lower()!r}; use one of {', '.join(x.lower() for x in LAYOUTS)}")
        if (m, n, k, layout, batch) in seen:
            g.fail("m", f"repeats the measurement of {m}x{n}x{k} {layout.lower()}"
                        + (f" batch {batch}" if batch > 1 else "") + "; keep one entry per shape and layout")
        seen.add((m, n, k, layout, batch))
        rate = g.number("tflop_per_s") * TFLOP
        if rate > peak_flop_per_s:
            g.fail("tflop_per_s", f"is {rate / TFLOP:g}, above the device peak {peak_flop_per_s / TFLOP:g}; "
                                  "check the timing (a GEMM cannot beat the peak)")
        out.append(GemmMeasurement(m, n, k, layout, rate, batch))
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
    shared_cores = f.number("shared_cores", "positive") if f.has("shared_cores") else 0.0
    skew = f.number("timeslice_skew", "nonneg") if f.has("timeslice_skew") else 0.0
    lag = f.number("timeslice_lag_us", "nonneg") * US if f.has("timeslice_lag_us") else 0.0
    lag_after = f.number("timeslice_lag_after_us", "nonneg") * US if f.has("timeslice_lag_after_us") else 0.0
    lag_span = f.number("timeslice_lag_span_us", "positive") * US if f.has("timeslice_lag_span_us") else math.inf
    beyond = f.number("timeslice_skew_beyond_span", "nonneg") if f.has("timeslice_skew_beyond_span") else 0.0
    if beyond and lag_span == math.inf:
        f.fail("timeslice_skew_beyond_span", "needs node.timeslice_lag_span_us, where the growth it gives begins")
    core_share = f.number("comm_core_share", "share") if f.has("comm_core_share") else 0.0
    stretch = f.number("comm_stretch_under_compute") if f.has("comm_stretch_under_compute") else 1.0
    if stretch < 1:
        f.fail("comm_stretch_under_compute", f"must be >= 1 (a time over the time alone), got {stretch:g}")
    latency_pace = (f.number("comm_latency_pace_under_compute", "share") if f.has("comm_latency_pace_under_compute")
                    else None)
    for key, value, alone in (("timeslice_skew", skew, 0.0), ("comm_stretch_under_compute", stretch, 1.0),
                              ("comm_latency_pace_under_compute", latency_pace, None), ("timeslice_lag_us", lag, 0.0),
                              ("timeslice_lag_after_us", lag_after, 0.0), ("comm_core_share", core_share, 0.0),
                              ("timeslice_lag_span_us", lag_span, math.inf),
                              ("timeslice_skew_beyond_span", beyond, 0.0)):
        if value != alone and not shared_cores:
            f.fail(key, "applies only to ranks that share cores; add node.shared_cores or remove it")
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
    return NodeSpec(n, tuple(links), tuple(nics), eff, switch, shared_cores, skew, stretch, latency_pace, lag,
                    lag_after, core_share, lag_span, beyond)


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
        nic_efficiency=_per_kind(f, "nic_efficiency", "fraction", 1.0),
        p2p_latency_s=(_per_protocol(f.table("p2p_latency_us"), allowed, "nonneg", US) if f.has("p2p_latency_us")
                       else {}),
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
