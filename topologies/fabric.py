"""The links a job uses, as flat arrays, and minimal routes between its GPUs.

The simulator shares bandwidth among transfers that cross the same link at
the same time, so it needs every directed link of the job as an integer id
with a capacity, and for each transfer the ids it crosses. ``Fabric`` builds
exactly that, with numpy arrays and integer arithmetic only: a 32,768-GCD
Frontier job (4,096 nodes, 32 groups, ~200,000 links) builds in a fraction
of a second, and routes are cached per (src, dst, nic).

Link ids, in order:

* per node n, a block of ``2 * len(node.links) + 4 * len(node.nics)`` ids:
  each device link in both directions, then per NIC k its attach link up
  (device -> NIC) and down, its injection link (NIC -> switch) and its
  ejection link (switch -> NIC);
* per used group, the all-to-all local links between its switches;
* per pair of used groups, each global link in both directions;
* with adaptive routing, per used group a global egress and ingress pool.

Routing between groups. "minimal": local hop to the switch owning the global
link, the global link (one of the pair's parallel links, ECMP-spread), local
hop. "adaptive" (Slingshot's UGAL-style routing) [estimate]: traffic leaving
a group spreads over all its global links, minimally or through an
intermediate group, so its bottleneck is the group's pooled global bandwidth:
links_per_pair x (n_groups - 1) links, halved because a non-minimal path
crosses two global links. The pool assumes the rest of the machine is idle;
local hops inside the groups are left out (a switch's 31 local ports carry
more than its 16 endpoints can inject).

Capacities are peak per direction times the achieved/peak efficiency of the
link's kind (``node.link_efficiency``; switch-to-switch links use the "nic"
efficiency, the same Slingshot link layer). Latencies: an injection link
carries the NIC's end-to-end latency, every link leaving a switch (local,
global, ejection) one switch hop; on-node links carry none (the collective
model's per-hop latencies cover them). Summing ``latency_s`` over a route
gives its zero-load latency.

The machine's first nodes are used, in order (see ``topologies.placement``).
Where NICs and global links sit follows ``topologies.dragonfly``.
"""

from __future__ import annotations

import numpy as np

from topologies import dragonfly
from topologies.machine import Machine
from twin.errors import TwinError


def _best_paths(n: int, bw: dict[tuple[int, int], float]) -> dict[tuple[int, int], tuple[int, ...]]:
    """For each ordered pair of local devices, the path a transfer takes.

    Fewest hops first (a direct link wins even where a 2-hop path is wider:
    NCCL/RCCL point-to-point uses the direct link), then the widest
    bottleneck, then the lowest intermediate indices. Paths list the devices
    visited, ends included. Nodes are small (<= 16 devices), so exhaustive
    search by increasing length is cheap and obviously right.
    """
    adj = {i: sorted(b for (a, b) in bw if a == i) for i in range(n)}
    paths: dict[tuple[int, int], tuple[int, ...]] = {}
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            for hops in range(1, n):
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

    def __init__(self, machine: Machine, n_gpus: int):
        if n_gpus < 1:
            raise TwinError(f"n_gpus: must be >= 1, got {n_gpus}")
        if n_gpus > machine.max_gpus:
            raise TwinError(f"n_gpus: {n_gpus} exceeds the {machine.max_gpus} GPUs of machine "
                            f"'{machine.name}'; use at most {machine.max_gpus}")
        self.machine, self.n_gpus = machine, n_gpus
        node, net = machine.node, machine.network
        self._gpn = gpn = node.gpus_per_node
        self.n_nodes = n_nodes = -(-n_gpus // gpn)
        eff = node.link_efficiency

        # Per-node template: offsets within a node's block.
        cap, lat, kind = [], [], []
        label: list[tuple[str, int | None]] = []  # name template, NIC index if it names a switch
        self._offset: dict[tuple[int, int], int] = {}
        for link in node.links:
            for a, b in ((link.a, link.b), (link.b, link.a)):
                self._offset[(a, b)] = len(cap)
                cap.append(link.bw_bytes_per_s * eff[link.kind])
                lat.append(0.0)
                kind.append(link.kind)
                label.append((f"gpu{a}->gpu{b}", None))
        self._nic_base = len(cap)  # NIC k: base + 4k + (0 up, 1 down, 2 inject, 3 eject)
        for nic in node.nics:
            g, k = nic.attach_gpu, nic.index
            up = nic.attach_bw_bytes_per_s * eff["attach"]
            port = nic.bw_bytes_per_s * eff["nic"]
            cap += [up, up, port, port]
            lat += [0.0, 0.0, net.nic_latency_s, net.switch_latency_s]
            kind += ["attach", "attach", "nic", "nic"]
            label += [(f"gpu{g}->nic{k}", None), (f"nic{k}->gpu{g}", None),
                      (f"nic{k}->{{sw}}", k), (f"{{sw}}->nic{k}", k)]
        self._block = block = len(cap)
        self._nic_gpu = [nic.attach_gpu for nic in node.nics]

        # Network links of the used groups.
        S = net.switches_per_group
        self._n_groups = n_groups = -(-n_nodes // net.nodes_per_group)
        self._local_base = n_nodes * block
        n_local = n_groups * S * (S - 1)
        self._global_base = self._local_base + n_local
        self._global: dict[tuple[int, int, int], int] = {}
        glabel = []
        for ga in range(n_groups):
            for gb in range(ga + 1, n_groups):
                for j in range(net.global_links_per_group_pair):
                    self._global[(ga, gb, j)] = self._global_base + len(glabel)
                    self._global[(gb, ga, j)] = self._global_base + len(glabel) + 1
                    glabel += [f"g{ga}->g{gb}#{j}", f"g{gb}->g{ga}#{j}"]
        net_cap = net.link_bw_bytes_per_s * eff["nic"]
        # Adaptive routing: one egress and one ingress pool per used group.
        self._pool_base = self._global_base + len(glabel)
        n_pool = 2 * n_groups if net.routing == "adaptive" else 0
        glabel += [f"g{g}:global-{d}" for g in range(n_groups) for d in ("out", "in")][:n_pool]
        pool_cap = net.global_links_per_group_pair * (net.n_groups - 1) * net_cap / 2
        n_net = n_local + len(glabel)
        self.capacity_bytes_per_s = np.concatenate(
            [np.tile(np.asarray(cap, dtype=float), n_nodes), np.full(n_net - n_pool, net_cap),
             np.full(n_pool, pool_cap)])
        self.latency_s = np.concatenate(
            [np.tile(np.asarray(lat, dtype=float), n_nodes), np.full(n_net, net.switch_latency_s)])
        self.link_kind = (kind * n_nodes + ["local"] * n_local + ["global"] * (len(glabel) - n_pool)
                          + ["global_pool"] * n_pool)
        self._label, self._glabel = label, glabel
        self._names: list[str] | None = None

        # Local routing tables.
        self._direct = {pair: self.capacity_bytes_per_s[off] for pair, off in self._offset.items()}
        self._path = _best_paths(gpn, self._direct)
        self._path_links = {pair: tuple(self._offset[(p[i], p[i + 1])] for i in range(len(p) - 1))
                            for pair, p in self._path.items()}
        self._nearest = [self._pick_nic(g) for g in range(gpn)]
        self._routes: dict[tuple[int, int, int | None], tuple[int, ...]] = {}

    # -------------------------------------------------------------- basics
    @property
    def n_links(self) -> int:
        return len(self.capacity_bytes_per_s)

    @property
    def link_name(self) -> list[str]:
        """Readable names, e.g. "n3:gpu0->gpu1", "n3:nic1->sw0.5", "g0:sw3->sw7", "g0->g1#2".

        Built on first use: the simulator needs ids, people need names.
        """
        if self._names is None:
            net, nics = self.machine.network, len(self.machine.node.nics)
            names: list[str] = []
            for n in range(self.n_nodes):
                for lab, k in self._label:
                    if k is not None:
                        grp, s = dragonfly.nic_switch(net, nics, n, k)
                        lab = lab.format(sw=f"sw{grp}.{s}")
                    names.append(f"n{n}:{lab}")
            S = net.switches_per_group
            for grp in range(self._n_groups):
                names += [f"g{grp}:sw{a}->sw{b}" for a in range(S) for b in range(S) if a != b]
            self._names = names + self._glabel
        return self._names

    def node_of(self, gpu: int) -> int:
        return gpu // self._gpn

    def local_of(self, gpu: int) -> int:
        return gpu % self._gpn

    def local_direct_links(self) -> dict[tuple[int, int], float]:
        """(a, b) local indices with a direct link -> effective bytes/s per direction."""
        return {pair: float(bw) for pair, bw in self._direct.items()}

    def nearest_nic(self, local_gpu: int) -> int:
        """The NIC NCCL/RCCL would use from this device.

        The NIC attached to the device; else the NIC attached to the device
        reached by the fastest direct link (Frontier: an even GCD uses the NIC
        of its package neighbour); in general: fewest hops, widest path,
        lowest NIC index.
        """
        if not 0 <= local_gpu < self._gpn:
            raise TwinError(f"local_gpu: {local_gpu} is outside 0..{self._gpn - 1}")
        if not self._nic_gpu:
            raise TwinError(f"node.nics: machine '{self.machine.name}' has no NIC; add [[node.nics]] entries")
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

        Same node: the on-node path (direct link, else the widest 2-hop path).
        Different nodes: on-node path to the NIC's device, attach, injection,
        minimal dragonfly route, ejection, attach, on-node path. ``nic`` is
        the NIC index used on both nodes (default: ``nearest_nic`` of src).
        """
        key = (src_gpu, dst_gpu, nic)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = self._route(src_gpu, dst_gpu, nic)
        return hit

    def _route(self, src: int, dst: int, nic: int | None) -> tuple[int, ...]:
        for name, gpu in (("src_gpu", src), ("dst_gpu", dst)):
            if not 0 <= gpu < self.n_gpus:
                raise TwinError(f"{name}: GPU {gpu} is outside this job's 0..{self.n_gpus - 1}")
        ns, ls = divmod(src, self._gpn)
        nd, ld = divmod(dst, self._gpn)
        if ns == nd:
            return tuple(ns * self._block + o for o in self._path_links.get((ls, ld), ()))
        k = self.nearest_nic(ls) if nic is None else nic
        if not 0 <= k < len(self._nic_gpu):
            raise TwinError(f"nic: {k} is outside 0..{len(self._nic_gpu) - 1} for machine '{self.machine.name}'")
        att = self._nic_gpu[k]
        bs, bd, nb = ns * self._block, nd * self._block, self._nic_base + 4 * k
        ids = [bs + o for o in self._path_links.get((ls, att), ())]
        ids += [bs + nb, bs + nb + 2]
        ids += self._switch_path(ns, nd, k)
        ids += [bd + nb + 3, bd + nb + 1]
        ids += [bd + o for o in self._path_links.get((att, ld), ())]
        return tuple(ids)

    def _local_link(self, group: int, a: int, b: int) -> int:
        S = self.machine.network.switches_per_group
        return self._local_base + (group * S + a) * (S - 1) + (b - (b > a))

    def _switch_path(self, ns: int, nd: int, k: int) -> list[int]:
        net, nics = self.machine.network, len(self._nic_gpu)
        ga, sa = dragonfly.nic_switch(net, nics, ns, k)
        gb, sb = dragonfly.nic_switch(net, nics, nd, k)
        if ga == gb:
            return [] if sa == sb else [self._local_link(ga, sa, sb)]
        if net.routing == "adaptive":
            return [self._pool_base + 2 * ga, self._pool_base + 2 * gb + 1]
        j = dragonfly.global_link_index(net, ns, nd)
        out_sw, in_sw = dragonfly.global_port(net, ga, gb, j), dragonfly.global_port(net, gb, ga, j)
        ids = [] if sa == out_sw else [self._local_link(ga, sa, out_sw)]
        ids.append(self._global[(ga, gb, j)])
        if in_sw != sb:
            ids.append(self._local_link(gb, in_sw, sb))
        return ids
