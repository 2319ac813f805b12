"""Flow types' routes kept by a CollectiveModel (cached_rows) for the next simulation on it.

twin.micro_batches and twin.pipeline_depth simulate several short steps of one plan, and twin search many
plans, on one CollectiveModel; each family's routes are computed once. A simulation on a model that has
seen other schedules must be the one on a fresh model, exactly.
"""

from __future__ import annotations

import numpy as np

from topologies.fabric import Fabric
from topologies.machine import load_machine
from topologies.placement import place_ranks
from twin.build import build_step
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.sim import collectives as collectives_module
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate
from twin.sim.flowtypes import FlowTypes
from twin.sim.symmetry import classify

MODEL = parse_model_spec("layers=8,hidden=2048,heads=16,seq=2048")
PLANS = ["tp=4,pp=4,dp=4,zero=1,mbs=1,recompute=full,global_batch=32",
         "tp=8,pp=2,dp=4,mbs=1,global_batch=16", "gx=2,gy=2,gz=4,gdata=4,mbs=1,global_batch=16"]


def _types(schedule, machine, model):
    return FlowTypes.build(schedule, classify(schedule, full=False), model, place_ranks(64, machine))


def test_a_shared_model_gives_the_flow_types_and_steps_of_fresh_ones(monkeypatch):
    machine = load_machine("frontier")
    shared = CollectiveModel(Fabric(machine, 64))
    schedules = [build_step(MODEL, parse_plan(p), machine, 64).schedule for p in PLANS]
    for schedule in schedules + schedules[::-1]:  # the second time round, every family's rows are kept ones
        warm, cold = _types(schedule, machine, shared), _types(schedule, machine, CollectiveModel(Fabric(machine, 64)))
        assert warm.keys == cold.keys and warm.latency_s == cold.latency_s and warm.phase_rows == cold.phase_rows
        np.testing.assert_array_equal(warm.loads, cold.loads)
        np.testing.assert_array_equal(warm.s_per_byte, cold.s_per_byte)
        assert simulate(schedule, machine, collectives=shared).step_time_s == simulate(schedule, machine).step_time_s
    assert shared._rows, "nothing was kept: the test does not exercise the cache"

    # past ROWS_KEPT the least recently used rows go, and are computed again when asked for
    monkeypatch.setattr(collectives_module, "ROWS_KEPT", 2)
    small = CollectiveModel(Fabric(machine, 64))
    for schedule in schedules:
        _types(schedule, machine, small)
        assert len(small._rows) <= 2
    np.testing.assert_array_equal(_types(schedules[0], machine, small).loads,
                                  _types(schedules[0], machine, CollectiveModel(Fabric(machine, 64))).loads)


def _columns_by_brute_force(rows):
    """The reference for _compress: every loaded link's full column (a dict row -> keyed load), the first link of
    each distinct column kept, in link order."""
    top = max(float(values.max()) for _, values in rows if len(values))
    columns: dict[int, dict[int, float]] = {}
    for r, (links, values) in enumerate(rows):
        for link, value in zip(links.tolist(), values.tolist()):
            if value:
                columns.setdefault(link, {})[r] = value
    kept, seen = [], set()
    for link in sorted(columns):
        signature = tuple(sorted((r, round(v / top, 12)) for r, v in columns[link].items()))
        if signature not in seen:
            seen.add(signature)
            kept.append(link)
    matrix = np.zeros((len(rows), len(kept)))
    for j, link in enumerate(kept):
        for r, v in columns[link].items():
            matrix[r, j] = v
    return matrix


def test_link_columns_merge_as_compared_one_by_one(monkeypatch):
    """flowtypes._compress merges links whose columns are equal by hashing them: the same matrix as comparing
    every column, also when every hash collides (the entry-by-entry check must catch it and compare columns)."""
    from twin.sim import flowtypes

    rng = np.random.default_rng(7)
    patterns = [(rng.choice(12, size=rng.integers(1, 5), replace=False), rng.choice([0.5, 1.0, 2.0, 3.0], size=4))
                for _ in range(30)]  # 30 distinct-ish columns, repeated over 3,000 links
    rows = [([], []) for _ in range(12)]
    for link in range(3000):
        members, loads = patterns[rng.integers(len(patterns))]
        for k, r in enumerate(members):
            rows[r][0].append(link)
            rows[r][1].append(loads[k])
    rows = [(np.array(links, dtype=np.int64), np.array(values)) for links, values in rows]
    expected = _columns_by_brute_force(rows)
    expected = expected / expected.max(axis=1, keepdims=True)
    for collide in (False, True):
        if collide:
            monkeypatch.setattr(flowtypes, "_column_hashes", lambda starts, *_: np.zeros(len(starts), np.uint64))
        matrix, _ = flowtypes._compress(rows, prune=False)
        assert matrix.shape == expected.shape and np.array_equal(matrix, expected)
