"""How long a compute op takes on one device, alone.

GEMMs run at the device's *empirical* GEMM peak (measured on a large square
GEMM, machines.md) times a shape efficiency and a layout efficiency:

- tile quantization: the m x n output is cut into gemm_tile_m x gemm_tile_n
  tiles; partial edge tiles do wasted work;
- wave quantization: tiles run in waves of `compute_units` at a time; the
  last wave may leave units idle;
- the k loop: a short inner dimension cannot hide the tile's prologue and
  epilogue, efficiency k / (k + gemm_k_half).

The product is normalised by its value at the 32768^3 GEMM the empirical peak
was measured on, so that GEMM runs at exactly the measured rate. A GEMM is
also never faster than streaming its operands through HBM.

Layout: `layout_efficiency` (relative to the best layout) applies to GEMMs
whose smallest dimension is at least `tn_penalty_min_dim` (the slow rocBLAS
kernels were seen on large GEMMs); a tunable GEMM with tuning on takes the best
layout, as AxoNN's first-batch kernel timing does.

Attention (flash) runs at attention_efficiency x the empirical GEMM rate,
plus attention_overhead_s per call where a machine file measured one (on a
CPU, SDPA's backward is several kernels and allocations: a fixed cost);
element-wise work streams its bytes at hbm_efficiency x HBM bandwidth. Every
kernel pays kernel_overhead_s (launch and tail).
"""

from __future__ import annotations

from functools import lru_cache
from math import ceil

from topologies.machine import DeviceSpec
from twin.ir import Attention, Elementwise, Gemm, Work

REFERENCE_GEMM_DIM = 32768  # the square GEMM the empirical peaks were measured on (AxoNN SC'24 sec. VI-C)


class ComputeModel:
    """Durations of compute ops on one device type, memoised by op."""

    def __init__(self, device: DeviceSpec) -> None:
        self.device = device
        d = REFERENCE_GEMM_DIM
        self._reference_efficiency = self._shape_efficiency(d, d, d)
        self.duration_s = lru_cache(maxsize=None)(self._duration_s)

    def _shape_efficiency(self, m: int, n: int, k: int) -> float:
        dev = self.device
        tiles_m, tiles_n = ceil(m / dev.gemm_tile_m), ceil(n / dev.gemm_tile_n)
        tile_util = (m * n) / (tiles_m * dev.gemm_tile_m * tiles_n * dev.gemm_tile_n)
        tiles = tiles_m * tiles_n
        waves = ceil(tiles / dev.compute_units)
        wave_util = tiles / (waves * dev.compute_units)
        k_util = k / (k + dev.gemm_k_half)
        return tile_util * wave_util * k_util

    def gemm_efficiency(self, gemm: Gemm) -> float:
        """Fraction of the empirical GEMM peak this GEMM reaches."""
        shape = self._shape_efficiency(gemm.m, gemm.n, gemm.k) / self._reference_efficiency
        return shape * self.layout_efficiency(gemm)

    def layout_efficiency(self, gemm: Gemm) -> float:
        """A tunable GEMM gets the best layout (AxoNN times them all in its first batch)."""
        dev = self.device
        if min(gemm.m, gemm.n, gemm.k) < dev.tn_penalty_min_dim:
            return 1.0
        if gemm.tunable:
            return max(dev.layout_efficiency.values())
        return dev.layout_efficiency[gemm.layout]

    def gemm_time_s(self, gemm: Gemm) -> float:
        dev = self.device
        flop_time = gemm.flops / (dev.empirical_gemm_flop_per_s * self.gemm_efficiency(gemm))
        operand_bytes = 2 * gemm.batch * (gemm.m * gemm.k + gemm.k * gemm.n + gemm.m * gemm.n)
        memory_time = operand_bytes / (dev.hbm_bw_bytes_per_s * dev.hbm_efficiency)
        return max(flop_time, memory_time) + dev.kernel_overhead_s

    def _duration_s(self, work: Work) -> float:
        dev = self.device
        if isinstance(work, Gemm):
            return self.gemm_time_s(work)
        if isinstance(work, Attention):
            rate = dev.empirical_gemm_flop_per_s * dev.attention_efficiency
            return work.flops / rate + dev.kernel_overhead_s + dev.attention_overhead_s
        if isinstance(work, Elementwise):
            return work.nbytes / (dev.hbm_bw_bytes_per_s * dev.hbm_efficiency) + dev.kernel_overhead_s
        raise TypeError(f"not a compute op: {type(work).__name__}")
