"""twin.collector: the garbage collector's settings are scoped, restored, and the schedule they assume is acyclic."""

from __future__ import annotations

import gc

import pytest

from topologies.machine import load_machine
from twin.build import build_step
from twin.collector import YOUNG_THRESHOLD, infrequent, paused
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


def test_infrequent_decorates_the_commands():
    from twin.cli.commands import main
    from twin.search.rank import search
    from twin.sim.engine import simulate
    from twin.validate import validate

    for command in (main, search, simulate, validate):
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


def test_a_built_schedule_leaves_no_cycles():
    """What collecting less often rests on: a schedule (pipeline transfers, ZeRO, tensor parallel collectives)
    is freed by reference counting alone, nothing left for the collector."""
    gc.collect()
    built = build_step(get_model("tiny"), parse_plan("tp=2,pp=2,dp=2,zero=1,mbs=1,global_batch=8"),
                       load_machine("dgx-a100"), 8)
    assert len(built.schedule.programs) > 1
    del built
    assert gc.collect() == 0
