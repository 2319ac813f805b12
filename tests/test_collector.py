"""twin.collector: the garbage collector's settings are scoped, restored, and the schedule they assume is acyclic."""

from __future__ import annotations

import gc

import pytest

from topologies.machine import load_machine
from twin.build import build_step
from twin.collector import YOUNG_THRESHOLD, frozen, infrequent, paused
from twin.model import get_model
from twin.plan import parse_plan


@pytest.fixture(autouse=True)
def restore_collector():
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_infrequent_raises_the_young_threshold_and_restores_it():
    gc.set_threshold(700, 10, 10)
    with infrequent():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        with infrequent():  # nested: left as is
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(RuntimeError), infrequent():
        raise RuntimeError("restored on the way out too")
    assert gc.get_threshold() == (700, 10, 10)


def test_infrequent_leaves_a_caller_that_collects_less_often_alone():
    gc.set_threshold(10 * YOUNG_THRESHOLD, 5, 5)
    with infrequent():
        assert gc.get_threshold() == (10 * YOUNG_THRESHOLD, 5, 5)
    assert gc.get_threshold() == (10 * YOUNG_THRESHOLD, 5, 5)


def test_a_command_runs_with_the_raised_threshold(monkeypatch):
    """`twin CMD` (twin.cli.commands.main) runs its command with infrequent passes, and restores them after."""
    import argparse

    from twin.cli import commands

    seen = []

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(func=lambda args: seen.append(gc.get_threshold()[0]) or 0)

    monkeypatch.setattr(commands, "build_parser", Parser)
    gc.set_threshold(700, 10, 10)
    assert commands.main([]) == 0
    assert seen == [YOUNG_THRESHOLD] and gc.get_threshold() == (700, 10, 10)


def test_the_library_entry_points_are_wrapped():
    """search, validate and fit, called from Python (the benchmarks do), carry the same decorator; only that
    they are wrapped is checked here (simulate's behaviour is, below)."""
    from twin.fit.solve import fit
    from twin.search.rank import search
    from twin.validate import validate

    for command in (search, validate, fit):
        assert hasattr(command, "__wrapped__"), command.__qualname__


def test_paused_restores_the_callers_state():
    gc.enable()
    with paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_paused_leaves_what_it_made_in_the_oldest_generation():
    """Not in the young one, whose next pass would traverse all of it; a cycle made while paused is still
    collected by a full pass."""
    gc.collect()
    with paused():
        made = [[i] for i in range(20_000)]
        a, b = [], []
        a.append(b), b.append(a)
        del a, b
    assert gc.get_count()[0] < 1_000 and gc.get_freeze_count() == 0
    assert any(o is made for o in gc.get_objects(generation=2))
    assert gc.collect() >= 2


def test_a_built_schedule_leaves_no_cycles():
    """What collecting less often rests on: a schedule (pipeline transfers, ZeRO, tensor parallel collectives)
    is freed by reference counting alone, nothing left for the collector."""
    gc.collect()
    built = build_step(get_model("tiny"), parse_plan("tp=2,pp=2,dp=2,zero=1,mbs=1,global_batch=8"),
                       load_machine("dgx-a100"), 8)
    assert len(built.schedule.programs) > 1
    del built
    assert gc.collect() == 0


def test_frozen_leaves_what_is_alive_out_and_returns_it_after():
    assert gc.get_freeze_count() == 0
    alive = [[] for _ in range(10)]
    with frozen():
        assert gc.get_freeze_count() >= len(alive)
    assert gc.get_freeze_count() == 0


def test_frozen_collects_garbage_made_before_it_afterwards():
    """A cycle that was garbage on the way in is frozen with the rest, then collected once returned."""
    gc.collect()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    with frozen():
        assert gc.collect() == 0  # frozen: not seen
    assert gc.collect() >= 2


def test_frozen_leaves_a_callers_own_freeze_alone():
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with frozen():
            pass
        assert gc.get_freeze_count() == count
    finally:
        gc.unfreeze()


def test_a_simulation_runs_frozen_with_infrequent_passes_and_restores_both(monkeypatch):
    from twin.sim import engine

    seen = []
    real = engine.Simulator.run

    def run(self):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))
        return real(self)

    monkeypatch.setattr(engine.Simulator, "run", run)
    built = build_step(get_model("tiny"), parse_plan("tp=2,dp=2,mbs=1,global_batch=4"), load_machine("dgx-a100"), 4)
    gc.set_threshold(700, 10, 10)
    engine.simulate(built.schedule, load_machine("dgx-a100"))
    (frozen_count, threshold), = seen
    assert frozen_count > 0 and threshold == YOUNG_THRESHOLD
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == (700, 10, 10)
