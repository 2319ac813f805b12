"""Rings and chains inside a node, packed on the links its GPUs actually have (cached per set of local GPUs
by twin.sim.collectives, which lowers ring and tree collectives onto them).

A directed arc (a, b) between two GPUs is a bundle of `count` physical links
(Frontier's in-package pairs have 4 xGMI links, others 2 or 1). Like RCCL's
topology search, each ring (channel) claims one link of every arc it uses,
so a 4-link bundle can carry four rings while a 1-link arc carries one. Up to
EXHAUSTIVE_MAX GPUs every ordering is tried; above it, a search polynomial in
the GPUs (tests/test_ring_packing.py compares the two).
"""

from __future__ import annotations

from itertools import permutations

# NCCL's MAXCHANNELS (src/include/device.h): at most 32 rings per communicator.
MAX_CHANNELS = 32


Arcs = dict[tuple[int, int], tuple[float, int]]  # (a, b) -> (bandwidth per link, link count)


def _score(seq: tuple[int, ...], arcs: Arcs, used: dict[tuple[int, int], int], closed: bool):
    """How good a ring or path is, or None if one of its arcs is missing or full.

    Slowest per-link bandwidth first; then the fewest links left on its most
    used arc, and the most links left in total, so rings spread over all the
    pairs of a fully connected node rather than reuse one cycle; then speed.
    """
    hops = len(seq) if closed else len(seq) - 1
    bws, left = [], []
    for i in range(hops):
        arc = (seq[i], seq[(i + 1) % len(seq)])
        if arc not in arcs or used.get(arc, 0) >= arcs[arc][1]:
            return None
        bws.append(arcs[arc][0])
        left.append(arcs[arc][1] - used.get(arc, 0))
    return (min(bws), min(left), sum(left), sum(bws)) if bws else (0.0, 0, 0, 0.0)


def _claim(seq: tuple[int, ...], used: dict[tuple[int, int], int], closed: bool) -> None:
    hops = len(seq) if closed else len(seq) - 1
    for i in range(hops):
        arc = (seq[i], seq[(i + 1) % len(seq)])
        used[arc] = used.get(arc, 0) + 1


# Up to this many GPUs, rings and chains are chosen over every ordering (at most 7! = 5,040 per ring): the
# best by _score, as NCCL's and RCCL's searches pick them on the nodes of today's machines (<= 8 GPUs). Above
# it (a 72-GPU NVLink domain, a 16-GPU node), a search polynomial in the GPUs (_polynomial_cycle) builds them.
EXHAUSTIVE_MAX = 8


def pack_rings(members: tuple[int, ...], arcs: Arcs, max_rings: int = MAX_CHANNELS) -> list[tuple[int, ...]]:
    """Directed rings over local GPUs, each claiming one free link of every arc it uses.

    Greedy: repeatedly take the ring whose slowest link is fastest (then the
    largest total). Falls back to one ring in the given order (routed over
    intermediate GPUs) when no ring of direct links exists.
    """
    if len(members) < 2:
        return [members]
    used: dict[tuple[int, int], int] = {}
    rings: list[tuple[int, ...]] = []
    first, rest = members[0], members[1:]
    while len(rings) < max_rings:
        if len(members) > EXHAUSTIVE_MAX:
            best = _polynomial_cycle(members, arcs, used, closed=True)
        else:
            best, best_score = None, None
            for perm in permutations(rest):
                cycle = (first,) + perm
                score = _score(cycle, arcs, used, closed=True)
                if score is not None and (best_score is None or score > best_score):
                    best, best_score = cycle, score
        if best is None:
            break
        rings.append(best)
        _claim(best, used, closed=True)
    return rings or [members]


def _polynomial_cycle(members: tuple[int, ...], arcs: Arcs, used: dict[tuple[int, int], int], closed: bool,
                      ) -> tuple[int, ...] | None:
    """A Hamiltonian ring (closed) or path from members[0] over arcs with a free link, in polynomial time.

    For each link speed from the fastest down, only arcs at least that fast are allowed, and a depth-first
    search extends the sequence to the member with the fewest free onward arcs (Warnsdorff's rule; ties: the
    arc with the most links left, then the member's order), backtracking at most BACKTRACK_BUDGET x n times.
    The first sequence found is taken: the slowest link of a ring is as fast as this search can make it.
    On a node switch (every pair one equal arc) and on regular direct-link nodes it finds a ring without
    backtracking; on an irregular node it may find fewer rings than an exhaustive search could, never a
    ring that is not one."""
    inside = set(members)
    for floor in sorted({bw for bw, _ in arcs.values()}, reverse=True):
        left = {(a, b): count - used.get((a, b), 0) for (a, b), (bw, count) in arcs.items()
                if bw >= floor and a in inside and b in inside}
        found = _warnsdorff(members, {k: v for k, v in left.items() if v > 0}, closed)
        if found is not None:
            return found
    return None


BACKTRACK_BUDGET = 64  # per member: bounds the search at O(n^3) arc looks


def _warnsdorff(members: tuple[int, ...], left: dict[tuple[int, int], int], closed: bool) -> tuple[int, ...] | None:
    """The depth-first search of _polynomial_cycle over the arcs with links `left` (all > 0)."""
    n = len(members)
    order = {m: i for i, m in enumerate(members)}
    out: dict[int, set[int]] = {m: set() for m in members}
    for a, b in left:
        out[a].add(b)
    path, on_path = [members[0]], {members[0]}
    budget = BACKTRACK_BUDGET * n

    def candidates(at: int) -> list[int]:
        nxt = out[at] - on_path
        return sorted(nxt, key=lambda m: (len(out[m] - on_path), -left[(at, m)], order[m]))

    choices = [candidates(path[-1])]
    while choices:
        if len(path) == n and (not closed or (path[-1], path[0]) in left):
            return tuple(path)
        if choices[-1] and len(path) < n:
            m = choices[-1].pop(0)
            path.append(m)
            on_path.add(m)
            choices.append(candidates(m))
            continue
        budget -= 1
        if budget < 0:
            return None
        choices.pop()
        if len(path) > 1:
            on_path.discard(path.pop())
    return None


def pack_chains(members: tuple[int, ...], starts: tuple[int, ...], arcs: Arcs) -> list[tuple[int, ...]]:
    """One Hamiltonian path per channel through a node's members, from that channel's start GPU.

    Channels claim links as rings do, so chains spread over the node's links;
    a channel that finds no free direct path takes the best path regardless.
    """
    used: dict[tuple[int, int], int] = {}
    chains = []
    for start in starts:
        others = tuple(m for m in members if m != start)
        best, best_score = None, None
        for relaxed in (False, True):
            if len(members) > EXHAUSTIVE_MAX:
                best = _polynomial_cycle((start,) + others, arcs, {} if relaxed else used, closed=False)
            else:
                for perm in permutations(others):
                    path = (start,) + perm
                    score = _score(path, arcs, {} if relaxed else used, closed=False)
                    if score is not None and (best_score is None or score > best_score):
                        best, best_score = path, score
            if best is not None:
                break
        path = best if best is not None else (start,) + others
        _claim(path, used, closed=False)
        chains.append(path)
    return chains
