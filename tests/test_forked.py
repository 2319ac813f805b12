"""twin.forked: a computation in a forked child, its value or its error back in the parent."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from twin.errors import TwinError
from twin.forked import Forked

needs_fork = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")


@needs_fork
def test_the_value_comes_from_the_child():
    parent = os.getpid()
    forked = Forked(lambda: (os.getpid(), [1.5, {"a": 2}]))
    pid, value = forked.result()
    assert pid != parent
    assert value == [1.5, {"a": 2}]


@needs_fork
def test_the_childs_error_is_raised_in_the_parent():
    def fails():
        raise TwinError("--plan pp=3: 8 layers do not split over 3 stages")

    with pytest.raises(TwinError, match="do not split"):
        Forked(fails).result()


@needs_fork
def test_a_child_that_dies_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="without a result"):
        Forked(lambda: os._exit(3)).result()


@needs_fork
def test_close_ends_a_child_still_running():
    forked = Forked(lambda: time.sleep(60))
    process = forked._process
    started = time.perf_counter()
    forked.close()
    assert time.perf_counter() - started < 10
    assert not process.is_alive()


def test_without_fork_it_runs_here_when_asked(monkeypatch):
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    calls = []
    forked = Forked(lambda: calls.append(os.getpid()) or "done")
    assert calls == []
    assert forked.result() == "done"
    assert calls == [os.getpid()]
