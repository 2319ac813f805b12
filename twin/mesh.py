"""Rank <-> mesh coordinates <-> process groups.

One torch-free module that both the simulator and the executor use, so a
simulated run and a measured run talk about the very same groups.

Axes are listed innermost first. AxoNN's nesting is X, Y, Z, data: rank
r = x + gx (y + gy (z + gz d)), so an X group is gx consecutive ranks, which the
placement (topologies.placement) puts on consecutive devices of one node.

Example: gx=2, gy=2, gz=1, gdata=2 (8 ranks)

    >>> m = Mesh((("x", 2), ("y", 2), ("z", 1), ("data", 2)))
    >>> m.groups("x")
    [(0, 1), (2, 3), (4, 5), (6, 7)]
    >>> m.groups("y")
    [(0, 2), (1, 3), (4, 6), (5, 7)]
    >>> m.groups("data")
    [(0, 4), (1, 5), (2, 6), (3, 7)]
    >>> m.coords(5)
    {'x': 1, 'y': 0, 'z': 0, 'data': 1}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import TYPE_CHECKING

import numpy as np

from twin.axes import AXES

if TYPE_CHECKING:
    from twin.plan import ParallelPlan


@dataclass(frozen=True)
class Mesh:
    """A logical grid of ranks; `axes` is ((name, size), ...) innermost first."""

    axes: tuple[tuple[str, int], ...]

    @property
    def size(self) -> int:
        return prod(size for _, size in self.axes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    def axis_size(self, axis: str) -> int:
        """The axis's size; of axes joined with "+" ("z+data"), the product of theirs."""
        sizes = dict(self.axes)
        return prod(sizes[name] for name in axis.split("+"))

    def position(self, rank: int, axis: str) -> int:
        """The rank's position in its group along `axis` (joined axes too: the order of `groups(axis)`)."""
        names = axis.split("+")
        position, stride = 0, 1
        for name, size in self.axes:
            if name in names:
                position += (rank // self.stride(name)) % size * stride
                stride *= size
        return position

    def stride(self, axis: str) -> int:
        """Distance in rank numbers between neighbours along `axis`."""
        stride = 1
        for name, size in self.axes:
            if name == axis:
                return stride
            stride *= size
        raise KeyError(axis)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for name, size in self.axes:
            out[name] = rank % size
            rank //= size
        return out

    def rank(self, coords: dict[str, int]) -> int:
        rank, stride = 0, 1
        for name, size in self.axes:
            rank += coords.get(name, 0) * stride
            stride *= size
        return rank

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group along `axis`, each ordered by its coordinate on the axis.

        `axis` may join several axes with "+" ("z+data": ranks that differ
        only in z and data, z varying fastest). Groups are listed in order of
        their lowest rank, so group i of an axis is the same on every run.
        """
        names = axis.split("+")
        for name in names:
            if name not in self.names:
                raise KeyError(name)
        outer_first = [name for name, _ in reversed(self.axes)]
        grid = np.arange(self.size).reshape([size for _, size in reversed(self.axes)])
        others = [i for i, name in enumerate(outer_first) if name not in names]
        members = [i for i, name in enumerate(outer_first) if name in names]  # outer first: rank order
        group_size = prod(self.axis_size(name) for name in names)
        rows = grid.transpose(others + members).reshape(-1, group_size)
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        return [tuple(row) for row in rows.tolist()]

    def group_instances(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """`groups(axis)` as a tuple, memoised per mesh: a search builds the same mesh for many plans
        (micro-batch counts, layer counts), and at tens of thousands of ranks listing the groups costs ms."""
        return _group_instances(self, axis)


@lru_cache(maxsize=32)  # a plan's bound builds its mesh 4 times (2 layer x 2 micro-batch counts), 5 axes each
def _group_instances(mesh: Mesh, axis: str) -> tuple[tuple[int, ...], ...]:
    return tuple(mesh.groups(axis))


def axonn_mesh(gx: int, gy: int, gz: int, gdata: int, pp: int = 1) -> Mesh:
    """AxoNN's 4D mesh: X innermost, then Y, Z, data; pipeline stages outermost
    (Megatron-LM's tp-dp-pp order: consecutive stages on different nodes)."""
    return Mesh((("x", gx), ("y", gy), ("z", gz), ("data", gdata), ("pp", pp)))


def plan_mesh(plan: ParallelPlan) -> Mesh:
    """The mesh a plan lays its ranks on, one axis per entry of twin.axes in its order (context parallelism
    between Z and data, as Megatron-Core's tp-cp-dp-pp): the builder's groups and the executor's numerics both
    take it from here."""
    return Mesh(tuple((axis.mesh, getattr(plan, axis.key)) for axis in AXES))


def dp_outermost(plan: ParallelPlan | None) -> bool:
    """Whether the plan's ranks are not placed rank r on GPU r: dpouter with more than one stage and replica."""
    return plan is not None and plan.dpouter and plan.pp > 1 and plan.gdata > 1


def stage_stride(plan: ParallelPlan) -> int:
    """GPUs from a pipeline's stage to its next: a stage's ranks in the default order, its tensor and context
    ranks alone with dpouter's (rank_gpus)."""
    stride = plan.world_size // plan.pp
    return stride // plan.gdata if dp_outermost(plan) else stride


def rank_gpus(plan: ParallelPlan | None) -> list[int] | None:
    """The GPU each rank runs on, where the plan does not run rank r on GPU r: None, or with `dpouter` the order
    tp-cp-pp-dp (Megatron's --use-tp-pp-dp-mapping; Meta's Llama 3 runs): the ranks keep the mesh above (pipeline
    outermost), and each pipeline's stages sit on consecutive GPUs, the data-parallel replicas outermost. Rank
    i + I (d + D s) (i inside the tensor and context axes, d its replica, s its stage) runs on GPU i + I (s + P d)."""
    if not dp_outermost(plan):
        return None
    replicas, stages = plan.gdata, plan.pp
    inner = plan.world_size // (replicas * stages)
    gpus = []
    for rank in range(plan.world_size):
        i, outer = rank % inner, rank // inner
        d, s = outer % replicas, outer // replicas
        gpus.append(i + inner * (s + stages * d))
    return gpus


def rank_on_gpu(plan: ParallelPlan | None, gpu: int) -> int:
    """The rank that runs on GPU `gpu` (rank_gpus inverted): `gpu` itself but with dpouter, where GPU i + I (s + P d)
    runs rank i + I (d + D s). The executor starts one process per GPU and has each run this rank's program."""
    if not dp_outermost(plan):
        return gpu
    replicas, stages = plan.gdata, plan.pp
    inner = plan.world_size // (replicas * stages)
    i, outer = gpu % inner, gpu // inner
    s, d = outer % stages, outer // stages
    return i + inner * (d + replicas * s)


def gradient_axis(plan: ParallelPlan) -> str:
    """The group a weight's gradient is summed over, and ZeRO shards over: data, joined with cp when the sequence
    is split (cp ranks hold the same weights and saw other tokens of the same sequences)."""
    return "+".join(name for name, size in (("cp", plan.cp), ("data", plan.gdata)) if size > 1) or "data"


def weight_shard_axis(plan: ParallelPlan) -> str:
    """The axis each linear's weight block is sharded over: Z, or Z and the gradient replicas together under
    ZeRO-3."""
    return f"z+{gradient_axis(plan)}" if plan.zero == 3 and plan.gradient_replicas > 1 else "z"
