"""Published measurements the twin must predict (reference/published.md).

These are others' measurements: the test, never the training set. Nothing in
the simulator reads them; benchmarks and (later) `twin validate` compare
against them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeakScalingRow:
    """AxoNN SC'24 (arXiv 2502.08145) Table III: sustained bf16 flop/s, 16.8M-token batch."""

    machine: str
    gpus: int
    model: str
    pflops_total: float
    pct_peak_advertised: float
    pct_peak_empirical: float


AXONN_TABLE_III: tuple[WeakScalingRow, ...] = (
    WeakScalingRow("perlmutter", 512, "GPT-5B", 80.8, 50.6, 56.2),
    WeakScalingRow("perlmutter", 1024, "GPT-10B", 197.8, 61.9, 68.8),
    WeakScalingRow("perlmutter", 2048, "GPT-20B", 352.5, 55.2, 61.3),
    WeakScalingRow("perlmutter", 4096, "GPT-40B", 620.1, 48.5, 53.9),
    WeakScalingRow("frontier", 512, "GPT-5B", 40.4, 41.1, 63.3),
    WeakScalingRow("frontier", 1024, "GPT-10B", 77.3, 39.3, 60.4),
    WeakScalingRow("frontier", 2048, "GPT-20B", 145.7, 37.0, 57.0),
    WeakScalingRow("frontier", 4096, "GPT-40B", 295.9, 37.6, 57.9),
    WeakScalingRow("frontier", 8192, "GPT-80B", 571.4, 36.3, 56.0),
)

AXONN_BATCH_SEQUENCES = 8192  # 16.8M tokens at sequence length 2048 [derived from their launch scripts]


# Dash et al. ISC'24 (arXiv 2312.12705), Megatron-DeepSpeed on Frontier, peak 191.5 TF/s per GCD.
FRONTIER_PAPER_TFLOPS_PER_GCD: dict[str, float] = {"22B": 73.5, "175B": 69.2, "1T": 61.2}
FRONTIER_PAPER_SCALING_EFFICIENCY: dict[str, dict[str, float]] = {
    "175B": {"weak": 1.00, "strong": 0.89},
    "1T": {"weak": 1.00, "strong": 0.87},
}
