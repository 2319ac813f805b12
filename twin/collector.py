"""Python's cyclic garbage collector, set for the twin's heaps.

The twin keeps large structures alive while it works (a schedule of 10^5 to
10^6 ops, their flow types, the search's caches) and makes short-lived
objects by the million beside them (SimPy's events, the bounds' tuples).
With CPython's default thresholds the collector runs a young-generation pass
every 700 net allocations and, every hundred of those, a full pass over
everything alive: in the default-axes search of GPT-320B on 32,768 GCDs
(one worker) that was 22,451 + 2,041 + 160 passes and 44 s of a 198 s
search. Almost nothing the twin allocates forms cycles (a schedule built
with the collector off leaves none to collect), so passing less often loses
nothing but time: at 100,000 the same search ran 8.8 s of collection and
168 s in all, at the same peak memory (1,151 against 1,152 MB), measured side
by side.

`paused` turns the collector off while a schedule is built (its passes over
the growing schedule took half the build time); `infrequent` raises the
young generation's threshold for a whole command (simulate, search,
validate, fit), restoring the caller's setting after; `frozen` leaves what
is alive when a simulation starts (its schedule above all) out of the passes
the simulation's own allocations trigger.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 100_000  # net allocations between young-generation passes (CPython's default: 700)


@contextmanager
def paused() -> Iterator[None]:
    """The collector off: for building a schedule, whose hundreds of thousands of small objects (ops, their work
    and tags) form no cycles. On the way out what was made is moved to the oldest generation untraversed (a
    freeze and an unfreeze: gc.freeze also resets the young generation's count), where it had been the young
    generation's next pass, which traversed all of it: 0.24 s after a 1.95 s build of 175B on 1,024 GCDs
    (286k ops). Whatever cycles were made meanwhile are collected by the next full pass. Where the caller has
    frozen objects itself the unfreeze would be theirs to do, and the collector is simply turned back on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


@contextmanager
def infrequent() -> Iterator[None]:
    """Young-generation passes every YOUNG_THRESHOLD net allocations at least (module docstring); the older
    generations' ratios as the caller set them. Nested uses and callers that already collect less often are left
    as they are."""
    previous = gc.get_threshold()
    if previous[0] >= YOUNG_THRESHOLD:
        yield
        return
    gc.set_threshold(YOUNG_THRESHOLD, *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)


@contextmanager
def frozen() -> Iterator[None]:
    """Everything alive now left out of the collector's passes until the end (gc.freeze), then returned to the
    oldest generation (gc.unfreeze). A simulation allocates millions of short-lived objects beside a schedule it
    only reads, and the first middle-generation pass traversed the whole schedule again: 1.9 s of a 17.8 s
    simulation of 1T on 3,072 GCDs (129 micro-batches, 1.28M ops), 0.26 s frozen. Nothing is lost: what was
    garbage on the way in is collected after, as it would have been. Left alone where the caller has frozen
    objects itself (unfreezing them is theirs to do)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
