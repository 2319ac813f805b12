"""The order in which a pipeline stage runs forward and backward passes.

Megatron-LM's schedules, as pure functions of (pp, vpp, micro-batches, stage):

- 1F1B (vpp = 1): stage s runs min(pp - s - 1, m) warm-up forwards, then
  alternates one forward and one backward, then drains the remaining
  backwards.
- Interleaved 1F1B (vpp > 1): each rank holds vpp model chunks; virtual
  micro-batch k runs on chunk (k // pp) % vpp forward and vpp - 1 - (k // pp) % vpp
  backward, for micro-batch (k // (pp vpp)) pp + k % pp; warm-up is
  2 (pp - s - 1) + (vpp - 1) pp virtual steps (capped at m vpp). Needs m to be a
  multiple of pp.

Nothing here knows about time: the bubble of (pp - 1)/m emerges when the
simulator runs these orders with their point-to-point dependencies.

    >>> [f"{s.kind}{s.micro_batch}" for s in pipeline_order(pp=4, vpp=1, micro_batches=4, stage=0)]
    ['F0', 'F1', 'F2', 'F3', 'B0', 'B1', 'B2', 'B3']
    >>> [f"{s.kind}{s.micro_batch}" for s in pipeline_order(pp=4, vpp=1, micro_batches=4, stage=3)]
    ['F0', 'B0', 'F1', 'B1', 'F2', 'B2', 'F3', 'B3']
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    kind: str  # "F" forward, "B" backward
    micro_batch: int
    chunk: int


def warmup_steps(pp: int, vpp: int, micro_batches: int, stage: int) -> int:
    total = micro_batches * vpp
    if vpp == 1:
        return min(pp - stage - 1, total)
    return min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)


def pipeline_order(pp: int, vpp: int, micro_batches: int, stage: int) -> list[Step]:
    total = micro_batches * vpp

    def micro_batch(k: int) -> int:
        return (k // (pp * vpp)) * pp + k % pp

    def forward(k: int) -> Step:
        return Step("F", micro_batch(k), (k // pp) % vpp)

    def backward(k: int) -> Step:
        return Step("B", micro_batch(k), vpp - 1 - (k // pp) % vpp)

    warmup = warmup_steps(pp, vpp, micro_batches, stage)
    order = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        order.append(forward(warmup + i))
        order.append(backward(i))
    order.extend(backward(k) for k in range(total - warmup, total))
    return order
