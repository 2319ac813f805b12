"""The links a job uses, as flat arrays, and minimal routes between its GPUs.

The simulator shares bandwidth among transfers that cross the same link at
the same time, so it needs every directed link of the job as an integer id
with a capacity, and for each transfer the ids it crosses. ``Fabric`` builds
exactly that, with numpy arrays and integer arithmetic only: a 32,768-GCD
Frontier job (4,096 nodes, 32 groups, ~200,000 links) builds in a fraction
of a second, and routes are cached per (src, dst, nic).

Link ids, in order:

* per node n, a block of ``2 * len(node.links) + 2 * gpus_per_node`` (the
  latter only with a node switch) ``+ 4 * len(node.nics)`` ids: each device
  link in both directions; with a node switch (NVSwitch), per device its
  port up (device -> switch) and down; then per NIC k its attach link up
  (device -> NIC) and down, its injection link (NIC -> switch) and its
  ejection link (switch -> NIC);
* the network's own links, as its kind's ``Layout`` lists them
  (``topologies.networks``): a dragonfly's local and global links and
  adaptive-routing pools, a fat tree's spine pool up and down per leaf. The
  layout also routes between the NICs' switches.

Both parts are read from the descriptions the networkx graphs are drawn
from (``topologies.networks.node.node_links`` and the layout's
``LinkBlock``s), so a link here is an edge of ``topologies.networks.graph.network_graph``.

Capacities are peak per direction times the achieved/peak efficiency of the
link's kind (``node.link_efficiency``; switch-to-switch links use its
"network" entry, or the "nic" one where a machine gives none: a collective
library can reach less of the NIC's line rate than the wire between switches
carries, as RCCL does on Frontier). Links carry no latency: a transfer's
latency is the collective model's (NCCL's base and per-hop latencies,
``[collectives]`` of the machine file), which covers the NIC and switch hops.

The machine's first nodes are used, in order (see ``topologies.placement``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from topologies.errors import InputError
from topologies.networks import layout
from topologies.networks.node import NETWORK, local_name, network_nic, node_links
from topologies.specs import Machine


def _best_paths(n: int, n_vertices: int, bw: dict[tuple[int, int], float]) -> dict[tuple[int, int], tuple[int, ...]]:
    """For each ordered pair of the n local devices, the path a transfer takes.

    Local vertices are the devices 0..n-1 and, from n on, node switches.
    Fewest hops first (a direct link wins even where a 2-hop path is wider:
    NCCL/RCCL point-to-point uses the direct link), then the widest
    bottleneck, then the lowest intermediate indices. Paths list the vertices
    visited, ends included. Nodes are small (<= 16 devices), so exhaustive
    search by increasing length is cheap and obviously right.
    """
    adj = {i: sorted(b for (a, b) in bw if a == i) for i in range(n_vertices)}
    paths: dict[tuple[int, int], tuple[int, ...]] = {}
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            for hops in range(1, n_vertices):
                found: list[tuple[float, tuple[int, ...]]] = []
                stack: list[tuple[int, ...]] = [(src,)]
                while stack:
                    path = stack.pop()
                    if len(path) == hops + 1:
                        if path[-1] == dst:
                            width = min(bw[(path[i], path[i + 1])] for i in range(hops))
                            found.append((-width, path))
                        continue
                    stack.extend(path + (m,) for m in adj[path[-1]] if m not in path)
                if found:
                    paths[(src, dst)] = min(found)[1]
                    break
    return paths


class Fabric:
    """All directed links a job of n_gpus uses, with integer ids, and minimal routes between GPUs."""

    def __init__(self, machine: Machine, n_gpus: int) -> None:
        if n_gpus < 1:
            raise InputError(f"n_gpus: must be >= 1, got {n_gpus}")
        if n_gpus > machine.max_gpus:
            raise InputError(f"n_gpus: {n_gpus} exceeds the {machine.max_gpus} GPUs of machine "
                             f"'{machine.name}'; use at most {machine.max_gpus}")
        self.machine, self.n_gpus = machine, n_gpus
        node, net = machine.node, machine.network
        self._gpn = gpn = node.gpus_per_node
        self.n_nodes = n_nodes = -(-n_gpus // gpn)
        eff = node.link_efficiency

        # Per-node template: each of node_links' links at its offset within a node's block. Local vertices
        # for routing inside a node: devices 0..gpn-1, the node switch (if any) gpn.
        links = node_links(node)
        cap = [link.bw_bytes_per_s * eff[link.kind] for link in links]
        kind = [link.kind for link in links]
        # Name template (the network switch as "{sw}"), and the NIC index where it names that switch.
        self._label = [(f"{local_name(link.u)}->{local_name(link.v)}", network_nic(link)) for link in links]
        sw = node.switch
        local = {("gpu", i): i for i in range(gpn)} | ({(sw.kind, 0): gpn} if sw is not None else {})
        self._offset = {(local[link.u], local[link.v]): i for i, link in enumerate(links)
                        if link.u in local and link.v in local}
        at = {(link.u, link.v): i for i, link in enumerate(links)}
        self._nic_hops: list[tuple[int, int, int, int]] = []  # per NIC: attach up, injection, ejection, attach down
        for nic in node.nics:
            gpu, port, far = ("gpu", nic.attach_gpu), ("nic", nic.index), (NETWORK, nic.index)
            self._nic_hops.append((at[gpu, port], at[port, far], at[far, port], at[port, gpu]))
        self._block = block = len(cap)
        self._nic_gpu = [nic.attach_gpu for nic in node.nics]

        # The network's links, after the node blocks.
        self._layout = layout(net, len(node.nics), n_nodes)
        self._net_base = n_nodes * block
        net_cap = self._layout.capacity_bytes_per_s(node.network_link_efficiency)
        self.capacity_bytes_per_s = np.concatenate([np.tile(np.asarray(cap, dtype=float), n_nodes), net_cap])
        self.link_kind = kind * n_nodes + self._layout.kinds()
        self._capacity_by_kind: dict[str, np.ndarray] = {}  # capacity_for's
        self._names: list[str] | None = None

        # Local routing tables.
        local_bw = {pair: self.capacity_bytes_per_s[off] for pair, off in self._offset.items()}
        self._direct = {(a, b): bw for (a, b), bw in local_bw.items() if a < gpn and b < gpn}
        self._path = _best_paths(gpn, gpn + (sw is not None), local_bw)
        self._path_links = {pair: tuple(self._offset[(p[i], p[i + 1])] for i in range(len(p) - 1))
                            for pair, p in self._path.items()}
        self._nearest = [self._pick_nic(g) for g in range(gpn)]
        # The same tables as arrays, for route_loads: on-node path link offsets per (from, to), -1 padded.
        self._nearest_array = np.array(self._nearest, dtype=np.int64)
        self._nic_gpu_array = np.array(self._nic_gpu, dtype=np.int64)
        self._nic_hop_array = np.array(self._nic_hops, dtype=np.int64).reshape(-1, 4)
        longest = max((len(p) for p in self._path_links.values()), default=0)
        self._path_table = np.full((gpn, gpn, max(longest, 1)), -1, dtype=np.int64)
        for (a, b), links in self._path_links.items():
            if a < gpn and b < gpn:
                self._path_table[a, b, :len(links)] = links
        self._routes: dict[tuple[int, int, int | None], tuple[int, ...]] = {}

    # -------------------------------------------------------------- basics
    @property
    def node_link_count(self) -> int:
        """Links with ids below this are the nodes' own (links_per_node each); the rest are the network's."""
        return self._net_base

    @property
    def links_per_node(self) -> int:
        """Node n's own links (on-node links, NIC attach, injection, ejection) have ids
        n * links_per_node + offset, the same offsets on every node: on-node routes translate."""
        return self._block

    @property
    def n_links(self) -> int:
        return len(self.capacity_bytes_per_s)

    @property
    def link_name(self) -> list[str]:
        """Readable names, e.g. "n3:gpu0->gpu1", "n3:gpu0->nvswitch", "n3:nic1->sw0.5",
        "g0:sw3->sw7", "g0->g1#2", "n3:nic1->leaf0.1", "leaf0.1->spine".

        Built on first use: the simulator needs ids, people need names.
        """
        if self._names is None:
            names: list[str] = []
            for n in range(self.n_nodes):
                for lab, k in self._label:
                    if k is not None:
                        lab = lab.format(sw=self._layout.nic_switch(n, k))
                    names.append(f"n{n}:{lab}")
            self._names = names + self._layout.names()
        return self._names

    def efficiency_key(self, link: int, kind: str | None = None) -> str:
        """The ``[node.link_efficiency]`` entry that scales this link's capacity: a node link's own kind, a
        network link's "network" (the NIC's where the file gives none): what `twin fit` attributes a
        transfer's time to when it fits the collective library's achieved bandwidth per level. "" for a NIC
        link under a collective `kind` with its own `[collectives.nic_efficiency]` (capacity_for): no level's
        efficiency scales it."""
        if link < self._net_base:
            return "" if self.link_kind[link] == "nic" and self._nic_rate_of_its_own(kind) else self.link_kind[link]
        return "network" if "network" in self.machine.node.link_efficiency else "nic"

    def capacity_for(self, kind: str | None) -> np.ndarray:
        """Per link id, what a collective of this kind achieves on it (bytes/s): `capacity_bytes_per_s`, but
        the NICs' injection and ejection links at the kind's `[collectives.nic_efficiency]` of their peak where
        the file gives one. None (a point-to-point transfer), or a kind without an entry: the plain capacities.
        Memoised per kind."""
        if not self._nic_rate_of_its_own(kind):
            return self.capacity_bytes_per_s
        if kind not in self._capacity_by_kind:
            capacity = self.capacity_bytes_per_s.copy()
            nic = np.flatnonzero(np.array(self.link_kind[:self._net_base]) == "nic")
            capacity[nic] *= self.machine.collectives.nic_efficiency[kind] / self.machine.node.link_efficiency["nic"]
            self._capacity_by_kind[kind] = capacity
        return self._capacity_by_kind[kind]

    def _nic_rate_of_its_own(self, kind: str | None) -> bool:
        """Whether the file's `[collectives.nic_efficiency]` gives this kind of collective its own NIC rate."""
        return kind in self.machine.collectives.nic_efficiency

    def node_of(self, gpu: int) -> int:
        return gpu // self._gpn

    def local_of(self, gpu: int) -> int:
        return gpu % self._gpn

    def local_direct_links(self) -> dict[tuple[int, int], float]:
        """(a, b) local indices with a direct link -> effective bytes/s per direction.

        Direct device-to-device links only: paths through a node switch are
        not listed (see ``ring_arcs``).
        """
        return {pair: float(bw) for pair, bw in self._direct.items()}

    def ring_arcs(self) -> dict[tuple[int, int], tuple[float, int]]:
        """(a, b) local devices -> (effective bytes/s per physical link, links) a ring may use.

        What a collective's ring search packs its channels over. A direct
        link bundle is one arc per direction whose ``count`` links each carry
        a ``1/count`` share. Through a node switch, every ordered pair without
        a direct link is a virtual arc of one link at the device's full port
        bandwidth: any pair is reachable at full speed. The port itself is
        still shared: ``route`` sends the transfer over the real
        device -> switch -> device links, so every ring through a device
        loads the same port.
        """
        node = self.machine.node
        arcs: dict[tuple[int, int], tuple[float, int]] = {}
        for link in node.links:
            for a, b in ((link.a, link.b), (link.b, link.a)):
                arcs[(a, b)] = (float(self._direct[(a, b)]) / link.count, link.count)
        if node.switch is not None:
            port = node.switch.bw_bytes_per_s * node.link_efficiency[node.switch.link_kind]
            for a in range(self._gpn):
                for b in range(self._gpn):
                    if a != b:
                        arcs.setdefault((a, b), (port, 1))
        return arcs

    def nearest_nic(self, local_gpu: int) -> int:
        """The NIC NCCL/RCCL would use from this device.

        The NIC attached to the device; else the NIC attached to the device
        reached by the fastest direct link (Frontier: an even GCD uses the NIC
        of its package neighbour); in general: fewest hops, widest path,
        lowest NIC index.
        """
        if not 0 <= local_gpu < self._gpn:
            raise InputError(f"local_gpu: {local_gpu} is outside 0..{self._gpn - 1}")
        if not self._nic_gpu:
            raise InputError(f"node.nics: machine '{self.machine.name}' has no NIC; add [[node.nics]] entries")
        return self._nearest[local_gpu]

    def _pick_nic(self, g: int) -> int:
        if not self._nic_gpu:
            return -1

        def score(k: int) -> tuple[int, float, int]:
            att = self._nic_gpu[k]
            if att == g:
                return (0, 0.0, k)
            links = self._path_links[(g, att)]
            return (len(links), -min(self.capacity_bytes_per_s[o] for o in links), k)

        return min(range(len(self._nic_gpu)), key=score)

    # -------------------------------------------------------------- routes
    def route(self, src_gpu: int, dst_gpu: int, nic: int | None = None) -> tuple[int, ...]:
        """Directed link ids from src_gpu to dst_gpu (empty if equal), cached.

        Same node: the on-node path (direct link, else the widest 2-hop path,
        e.g. through the node switch). Different nodes: on-node path to the
        NIC's device, attach, injection, the network's route between the two
        NICs' switches, ejection, attach, on-node path. ``nic`` is
        the NIC index used on both nodes (default: ``nearest_nic`` of src).
        """
        key = (src_gpu, dst_gpu, nic)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = self._route(src_gpu, dst_gpu, nic)
        return hit

    def route_loads(self, transfers: Iterable[tuple[int, int, float, int | None]]) -> dict[int, float]:
        """Link id -> summed amount over `transfers` (src_gpu, dst_gpu, amount, nic): what adding each
        `route(src, dst, nic)` times its amount gives, up to the order of the sums.

        A collective lowered on 32,768 GPUs routes ~10^5 transfers between node heads, which one by one
        took most of a simulation's time; here they go through numpy together: the on-node paths from a
        table of every (from, to) device pair, the NIC hops from the NIC's, the network path from the
        network kind's ``paths``."""
        total = self.route_dense(transfers)
        touched = np.flatnonzero(total)
        return dict(zip(touched.tolist(), total[touched].tolist()))

    def route_dense(self, transfers: Iterable[tuple[int, int, float, int | None]]) -> np.ndarray:
        """route_loads as a vector over every link of the fabric (zero where nothing crosses): for callers that add
        many batches before they look at the links."""
        return self.route_dense_arrays(*transfer_arrays(list(transfers)))

    def route_dense_arrays(self, src: np.ndarray, dst: np.ndarray, amount: np.ndarray, nic: np.ndarray
                           ) -> np.ndarray:
        """route_dense with the transfers as arrays (nic -1: the source's nearest), for callers that build them
        with numpy (a family's rings across nodes: twin.sim.lowerings)."""
        if not len(src):
            return np.zeros(len(self.capacity_bytes_per_s))
        bad = (src < 0) | (src >= self.n_gpus) | (dst < 0) | (dst >= self.n_gpus) | (nic >= len(self._nic_gpu))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            self._route(int(src[i]), int(dst[i]), None if nic[i] < 0 else int(nic[i]))  # raises the one-line error
        ns, ls = np.divmod(src, self._gpn)
        nd, ld = np.divmod(dst, self._gpn)
        away = ns != nd
        k = np.where(nic >= 0, nic, self._nearest_array[ls])
        att = self._nic_gpu_array[k]
        # On-node legs: (node, from, to) = (ns, ls, ld) on one node; (ns, ls, att) and (nd, att, ld) across.
        leg_node = np.concatenate([ns, nd[away]])
        leg_from = np.concatenate([ls, att[away]])
        leg_to = np.concatenate([np.where(away, att, ld), ld[away]])
        leg_amount = np.concatenate([amount, amount[away]])
        table = self._path_table[leg_from, leg_to]  # (legs, longest on-node path), -1 padded
        used = table >= 0
        ids = [(leg_node[:, None] * self._block + table)[used]]
        weights = [np.broadcast_to(leg_amount[:, None], table.shape)[used]]
        hops = self._nic_hop_array[k[away]]  # (transfers across, 4): attach up, injection, ejection, attach down
        ids += [ns[away, None] * self._block + hops[:, :2], nd[away, None] * self._block + hops[:, 2:]]
        weights += [np.repeat(amount[away], 2), np.repeat(amount[away], 2)]
        row, link = self._layout.paths(ns[away], nd[away], k[away])
        ids.append(self._net_base + link)
        weights.append(amount[away][row])
        flat_ids = np.concatenate([i.ravel() for i in ids])
        return np.bincount(flat_ids, weights=np.concatenate([w.ravel() for w in weights]),
                           minlength=len(self.capacity_bytes_per_s))

    def _route(self, src: int, dst: int, nic: int | None) -> tuple[int, ...]:
        for name, gpu in (("src_gpu", src), ("dst_gpu", dst)):
            if not 0 <= gpu < self.n_gpus:
                raise InputError(f"{name}: GPU {gpu} is outside this job's 0..{self.n_gpus - 1}")
        ns, ls = divmod(src, self._gpn)
        nd, ld = divmod(dst, self._gpn)
        if ns == nd:
            return tuple(ns * self._block + o for o in self._path_links.get((ls, ld), ()))
        k = self.nearest_nic(ls) if nic is None else nic
        if not 0 <= k < len(self._nic_gpu):
            raise InputError(f"nic: {k} is outside 0..{len(self._nic_gpu) - 1} for machine '{self.machine.name}'")
        att = self._nic_gpu[k]
        bs, bd = ns * self._block, nd * self._block
        up, inject, eject, down = self._nic_hops[k]
        ids = [bs + o for o in self._path_links.get((ls, att), ())]
        ids += [bs + up, bs + inject]
        ids += [self._net_base + i for i in self._layout.path(ns, nd, k)]
        ids += [bd + eject, bd + down]
        ids += [bd + o for o in self._path_links.get((att, ld), ())]
        return tuple(ids)


def transfer_arrays(rows: list[tuple[int, int, float, int | None]]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, amount, nic) arrays of (src_gpu, dst_gpu, amount, nic) transfers, nic -1 for None (the
    source's nearest): what Fabric.route_dense_arrays takes."""
    src, dst = (np.fromiter((r[i] for r in rows), dtype=np.int64, count=len(rows)) for i in (0, 1))
    amount = np.fromiter((r[2] for r in rows), dtype=float, count=len(rows))
    nic = np.fromiter((-1 if r[3] is None else r[3] for r in rows), dtype=np.int64, count=len(rows))
    return src, dst, amount, nic
