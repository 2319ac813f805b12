"""Published collective measurements the twin was not calibrated on (benchmarks/collective_facts.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from collective_facts import MIB, busbw_alone  # noqa: E402


@pytest.mark.parametrize("gpus,measured", [(tuple(range(8)), 122.6), ((0, 4), 22.9)])
def test_alps_nccl_all_reduce_bus_bandwidth_within_ten_percent(gpus, measured):
    """cscs-docs: NCCL all_reduce of 128 MiB on 2 Alps nodes (4 GPUs each, then 1 each)."""
    twin, _ = busbw_alone("alps", gpus, 128 * MIB)
    assert twin == pytest.approx(measured, rel=0.10)
