"""Which ranks to simulate, and which collectives run as concurrent copies.

Ranks that share a Program run the same ops up to group membership, so in
the reduced simulation each Program is simulated once, by its first rank (the
class representative). A collective that the representative issues on axis A
stands for every instance of A whose members belong to the same set of
classes (a "family"): all of them run at the same time, so the family's
network load is the sum of its instances' loads, and it completes when its
slowest instance would. With every rank its own class (full=True) each
instance is its own family and the simulation is the exact per-rank one;
tests compare the two on small cases. A schedule whose classes meet different
sets of classes on one axis has no such reduction and is simulated in full.

The reduction is exact when every instance of an axis sees the same
bottleneck, as on fully connected nodes (Perlmutter, Alps) and for most
Frontier plans. Where instances of one axis take different links (Frontier
GCD pairs with and without a direct xGMI link), the family runs at the pace
of its slowest instance: conservative, and within a few percent of the full
simulation in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.ir import Schedule


@dataclass(frozen=True)
class Family:
    """Instances of one axis that run together, and the classes that take part."""

    axis: str
    classes: tuple[int, ...]
    instances: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Symmetry:
    representatives: tuple[int, ...]  # class index -> the rank simulated for it
    programs: tuple[int, ...]  # class index -> program index
    families: tuple[Family, ...]
    family_of: dict[tuple[int, str], int]  # (class index, axis) -> family index
    class_of: dict[int, int]  # rank -> class index


def classify(schedule: Schedule, full: bool) -> Symmetry:
    if full:
        prog_of = schedule.program_of()
        representatives = tuple(range(schedule.world_size))
        programs = tuple(prog_of[r] for r in representatives)
        class_of = {r: r for r in representatives}
    else:
        representatives = tuple(min(p.ranks) for p in schedule.programs)
        programs = tuple(range(len(schedule.programs)))
        class_of = {r: i for i, p in enumerate(schedule.programs) for r in p.ranks}

    families: list[Family] = []
    family_of: dict[tuple[int, str], int] = {}
    for axis in schedule.groups:
        by_key: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for members in axis.instances:
            key = tuple(sorted({class_of[r] for r in members}))
            by_key.setdefault(key, []).append(members)
        for key, instances in by_key.items():
            index = len(families)
            families.append(Family(axis.name, key, tuple(instances)))
            for c in key:
                if (c, axis.name) in family_of:
                    # One class meets different sets of classes on this axis: its
                    # instances are not copies of each other, so no reduction is exact.
                    return classify(schedule, full=True)
                family_of[(c, axis.name)] = index
    return Symmetry(representatives, programs, tuple(families), family_of, class_of)
