"""Which transformer layers each pipeline stage, and each of its virtual chunks, holds.

Megatron splits the layers evenly over pp x vpp model chunks; chunk c of
stage s is the (c pp + s)-th of them, so an interleaved stage holds every
pp-th slice of the model. Megatron-Core can also count the embedding and
the loss as one layer each in that split (--account-for-embedding-in-
pipeline-split, --account-for-loss-in-pipeline-split: the plan's `pemb` and
`ploss`): the first chunk of the first stage then holds one layer fewer, and
the last chunk of the last stage likewise, so the stages that also run the
embedding, or the LM head and the loss, are not the pipeline's slowest.
That is how Llama 3 405B's 126 layers went over 16 stages (Dubey et al.
2024, sec. 3.3.2: one layer fewer on the first and on the last stage): 128
slots, 8 a stage. A chunk may hold no layer at all (the embedding alone,
with one slot a chunk), as Llama 3's first chunk did.

One function answers for every user (the builder, memory, the search's
bounds, the deep-pipeline shortcut), so they cannot disagree about a split.
"""

from __future__ import annotations

from typing import Protocol


class PipelineShape(Protocol):
    """What of a plan (twin.plan.ParallelPlan) decides the split; a protocol, since twin.plan validates with this
    module."""

    pp: int
    vpp: int
    pemb: bool
    ploss: bool


def extra_slots(plan: PipelineShape) -> int:
    """Slots of the split that hold no transformer layer: the embedding's (pemb) and the loss's (ploss)."""
    return int(plan.pemb) + int(plan.ploss)


def slots(layers: int, plan: PipelineShape) -> int:
    """The split's slots: the layers, and the embedding and the loss where they count as one."""
    return layers + extra_slots(plan)


def split_error(layers: int, plan: PipelineShape) -> str | None:
    """Why `layers` cannot be split by `plan` (a one-line reason for --plan), or None."""
    if (plan.pemb or plan.ploss) and plan.pp == 1:
        return "pemb and ploss count the embedding and the loss in the pipeline's split; they need pp > 1"
    chunks = plan.pp * plan.vpp
    total = slots(layers, plan)
    if total % chunks:
        counted = (f"{layers} layers + {extra_slots(plan)} (embedding/loss counted) = {total} slots"
                   if extra_slots(plan) else f"{layers} layers")
        return (f"{counted} do not split into pp x vpp = {plan.pp} x {plan.vpp} = {chunks} stages of equal size; "
                "choose pp*vpp dividing them, or count the embedding and the loss as layers (pemb=1, ploss=1)")
    return None


def chunk_layers(layers: int, plan: PipelineShape, stage: int, chunk: int = 0) -> range:
    """The layers (0-based, in model order) of virtual chunk `chunk` on pipeline stage `stage`."""
    per_chunk = slots(layers, plan) // (plan.pp * plan.vpp)
    first = (chunk * plan.pp + stage) * per_chunk - int(plan.pemb)
    return range(max(first, 0), min(first + per_chunk, layers))


def most_chunk_layers(layers: int, plan: PipelineShape) -> int:
    """The most transformer layers any model chunk holds (the end chunks hold fewer with pemb or ploss)."""
    if is_even(plan):
        return layers // (plan.pp * plan.vpp)
    return max(len(chunk_layers(layers, plan, stage, chunk)) for stage in range(plan.pp) for chunk in range(plan.vpp))


def stage_layers(layers: int, plan: PipelineShape, stage: int) -> int:
    """How many layers stage `stage` holds over all its chunks (memory asks per stage for every plan a search
    sizes: the even split without building ranges)."""
    if is_even(plan):
        return layers // plan.pp
    return sum(len(chunk_layers(layers, plan, stage, c)) for c in range(plan.vpp))


def fewest_and_most(layers: int, plan: PipelineShape) -> tuple[int, int]:
    """The fewest and the most layers any stage holds (equal where the split is even)."""
    if is_even(plan):
        return layers // plan.pp, layers // plan.pp
    counts = [stage_layers(layers, plan, stage) for stage in range(plan.pp)]
    return min(counts), max(counts)


def is_even(plan: PipelineShape) -> bool:
    """Whether every chunk holds the same layers (no embedding or loss slot)."""
    return not extra_slots(plan)
