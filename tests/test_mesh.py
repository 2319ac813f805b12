"""Rank <-> mesh coordinates <-> process groups (twin.mesh)."""

from __future__ import annotations

import itertools

import pytest

from twin.mesh import Mesh, axonn_mesh

MESHES = [
    (1, 1, 1, 1),
    (2, 2, 1, 2),
    (4, 1, 2, 1),
    (1, 4, 1, 2),
    (2, 4, 2, 1),
    (8, 1, 16, 2),
    (2, 3, 5, 7),  # not powers of two: catches stride mix-ups that powers of two hide
]
AXES = ("x", "y", "z", "data")


def expected_rank(x: int, y: int, z: int, d: int, gx: int, gy: int, gz: int) -> int:
    """AxoNN nesting, X innermost: r = x + gx (y + gy (z + gz d))."""
    return x + gx * (y + gy * (z + gz * d))


@pytest.mark.parametrize("dims", MESHES)
def test_every_axis_partitions_all_ranks(dims):
    mesh = axonn_mesh(*dims)
    size = dims[0] * dims[1] * dims[2] * dims[3]
    assert mesh.size == size
    assert mesh.names[:4] == AXES  # innermost first
    for axis, n in zip(AXES, dims):
        groups = mesh.groups(axis)
        assert len(groups) == size // n
        assert all(len(g) == n for g in groups)
        flat = [r for g in groups for r in g]
        assert sorted(flat) == list(range(size))  # each rank exactly once
        assert [g[0] for g in groups] == sorted(g[0] for g in groups)  # listed by lowest rank


@pytest.mark.parametrize("dims", MESHES)
def test_groups_vary_only_their_own_coordinate(dims):
    gx, gy, gz, gd = dims
    mesh = axonn_mesh(*dims)
    for axis in AXES:
        for group in mesh.groups(axis):
            coords = [mesh.coords(r) for r in group]
            # ordered by their coordinate on the axis, 0..n-1
            assert [c[axis] for c in coords] == list(range(len(group)))
            for other in AXES:
                if other != axis:
                    assert len({c[other] for c in coords}) == 1


@pytest.mark.parametrize("dims", MESHES)
def test_rank_coords_round_trip(dims):
    gx, gy, gz, gd = dims
    mesh = axonn_mesh(*dims)
    for x, y, z, d in itertools.product(range(gx), range(gy), range(gz), range(gd)):
        r = expected_rank(x, y, z, d, gx, gy, gz)
        coords = mesh.coords(r)
        assert {a: coords[a] for a in AXES} == {"x": x, "y": y, "z": z, "data": d}
        assert all(v == 0 for a, v in coords.items() if a not in AXES)  # any outer axis has size 1
        assert mesh.rank({"x": x, "y": y, "z": z, "data": d}) == r
    for r in range(mesh.size):
        assert mesh.rank(mesh.coords(r)) == r


@pytest.mark.parametrize("dims", MESHES)
def test_x_groups_are_consecutive_ranks(dims):
    gx = dims[0]
    mesh = axonn_mesh(*dims)
    for i, group in enumerate(mesh.groups("x")):
        assert group == tuple(range(i * gx, (i + 1) * gx))


@pytest.mark.parametrize("dims", MESHES)
def test_strides(dims):
    gx, gy, gz, _ = dims
    mesh = axonn_mesh(*dims)
    assert [mesh.stride(a) for a in AXES] == [1, gx, gx * gy, gx * gy * gz]
    for axis, stride in zip(AXES, (1, gx, gx * gy, gx * gy * gz)):
        for group in mesh.groups(axis):
            assert all(b - a == stride for a, b in zip(group, group[1:]))


def test_docstring_example():
    m = Mesh((("x", 2), ("y", 2), ("z", 1), ("data", 2)))
    assert m.groups("x") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert m.groups("y") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert m.groups("z") == [(r,) for r in range(8)]
    assert m.groups("data") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert m.coords(5) == {"x": 1, "y": 0, "z": 0, "data": 1}
    assert m.names == ("x", "y", "z", "data")
    assert m.axis_size("y") == 2


def test_unknown_axis():
    with pytest.raises(KeyError):
        axonn_mesh(2, 2, 1, 1).stride("w")
