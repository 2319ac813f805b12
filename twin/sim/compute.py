"""How long a compute op takes on one device, alone.

GEMMs run at the device's *empirical* GEMM peak (measured on a large square
GEMM, machines.md) times a shape efficiency and a layout efficiency:

- tile quantization: the m x n output is cut into gemm_tile_m x gemm_tile_n
  tiles; partial edge tiles do wasted work;
- wave quantization: tiles run in waves of `compute_units` at a time; the
  last wave may leave units idle. A batched GEMM's tiles are those of all its
  products together (cuBLAS launches one grid over the batch). A GEMM pays
  `gemm_wave_quantization` of that idle time: 1 where kernels are grids of
  fixed tiles (the A100's: its published training-shape timings fit full
  waves), 0 where kernels keep every unit busy (Hopper's persistent cuBLAS
  kernels, measured on an H200: docs/gpu-h200.md);
- the k loop: a short inner dimension cannot hide the tile's prologue and
  epilogue, efficiency k / (k + gemm_k_half).

The product is normalised by its value at the 32768^3 GEMM the empirical peak
was measured on, so that GEMM runs at exactly the measured rate. A GEMM is
also never faster than streaming its operands through HBM.

Layout: `layout_efficiency` (relative to the best layout) applies to GEMMs
whose smallest dimension is at least `layout_penalty_min_dim` (the slow rocBLAS
kernels were seen on large GEMMs); a tunable GEMM with tuning on takes the best
layout, as AxoNN's first-batch kernel timing does. Layouts are named as the
product reads its operands, row-major: NT is C = A B^T, the forward of a
linear (x W^T), which AxoNN and rocBLAS call TN.

Measured GEMMs: where the machine file lists GEMMs timed on the device
(``[[device.gemm_measured]]``, e.g. from benchmarks/gemm_shapes.py), a GEMM
runs at the rate measured for the nearest measured shape (log distance over
m, n, k and batch; the same layout, then the same batched-or-not,
preferred), times the model's ratio between its own shape and that one. At
a measured shape the measurement is the answer; the tile, wave and k-loop
estimates only carry it to shapes nearby. A tunable
GEMM takes the fastest layout. Never above the device's peak.

FP8 GEMMs (a plan's fp8=1 linears) run at the device's empirical FP8 rate
(measured on an 8192^3 GEMM, where the model is normalised for them) with
the same shape model, except that the k loop's fixed cost weighs as at
half the inner dimension (gemm_k_half doubled: a tile's main loop moves
twice the elements of k per cycle, its prologue and epilogue take as long),
and their 1-byte operands stream at half the bytes; measured GEMMs
(bf16 timings) are not carried to them.

Attention (flash) runs at attention_efficiency x the empirical GEMM rate,
plus attention_overhead_s per call where a machine file measured one (on a
CPU, SDPA's backward is several kernels and allocations: a fixed cost);
element-wise work streams its bytes at hbm_efficiency x HBM bandwidth. Every
kernel pays kernel_overhead_s (launch and tail).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from math import ceil, log

from topologies.machine import LAYOUTS, DeviceSpec, GemmMeasurement
from twin.errors import TwinError
from twin.ir import FP8, Attention, Elementwise, Gemm, Op, Work

FP8_K_HALF_SCALE = 2.0  # an FP8 tile's k loop moves twice the elements per cycle: its fixed cost weighs as at k / 2
REFERENCE_GEMM_DIM = 32768  # the square GEMM the empirical peaks were measured on (AxoNN SC'24 sec. VI-C)
FP8_REFERENCE_GEMM_DIM = 8192  # the square GEMM the empirical FP8 rates were measured on (the machine files' sources)


class ComputeModel:
    """Durations of compute ops on one device type, memoised by op."""

    def __init__(self, device: DeviceSpec) -> None:
        self.device = device
        d = REFERENCE_GEMM_DIM
        self._reference_efficiency = self._shape_efficiency(d, d, d)
        d8 = FP8_REFERENCE_GEMM_DIM
        self._reference_efficiency_fp8 = self._shape_efficiency(d8, d8, d8, 1, FP8_K_HALF_SCALE)
        self.duration_s = lru_cache(maxsize=None)(self._duration_s)

    def op_durations_s(self, ops: Iterable[Op]) -> list[float]:
        """Each op's time alone, 0 for communication. Looked up by the work object's id first: a schedule holds
        ~10^5 work objects of ~10^2 values (blocks are copied, twin.builders.replay), and an int hashes faster
        than a frozen dataclass; the ops hold their works for the call, so no id is reused within it."""
        known: dict[int, float] = {}
        out = []
        for op in ops:
            work = op.work
            seconds = known.get(id(work))
            if seconds is None:
                seconds = known[id(work)] = 0.0 if work.comm else self.duration_s(work)
            out.append(seconds)
        return out

    def _shape_efficiency(self, m: int, n: int, k: int, batch: int = 1, k_half_scale: float = 1.0) -> float:
        dev = self.device
        tiles_m, tiles_n = ceil(m / dev.gemm_tile_m), ceil(n / dev.gemm_tile_n)
        tile_util = (m * n) / (tiles_m * dev.gemm_tile_m * tiles_n * dev.gemm_tile_n)
        tiles = batch * tiles_m * tiles_n
        waves = ceil(tiles / dev.compute_units)
        wave_util = 1.0 - dev.gemm_wave_quantization * (1.0 - tiles / (waves * dev.compute_units))
        k_util = k / (k + dev.gemm_k_half * k_half_scale)
        return tile_util * wave_util * k_util

    def gemm_efficiency(self, gemm: Gemm) -> float:
        """Fraction of the empirical GEMM peak (of its dtype) this GEMM reaches (module docstring: model, then
        measurements)."""
        if gemm.dtype == FP8:  # normalised where the FP8 rate was measured, so larger GEMMs run a little faster;
            dev = self.device  # never above the FP8 peak
            efficiency = self._modelled(gemm.m, gemm.n, gemm.k, gemm.layout, gemm.tunable, gemm.batch, fp8=True)
            rate = dev.empirical_gemm_fp8_flop_per_s
            return min(efficiency, dev.peak_fp8_flop_per_s / rate) if rate else efficiency
        if not self.device.gemm_measured:
            return self._modelled(gemm.m, gemm.n, gemm.k, gemm.layout, gemm.tunable, gemm.batch)
        layouts = LAYOUTS if gemm.tunable else (gemm.layout,)
        best = max(self._measured(gemm.m, gemm.n, gemm.k, layout, gemm.batch) for layout in layouts)
        return min(best, self.device.peak_flop_per_s / self.device.empirical_gemm_flop_per_s)

    def _modelled(self, m: int, n: int, k: int, layout: str, tunable: bool, batch: int = 1, fp8: bool = False
                  ) -> float:
        """The shape model's efficiency relative to the GEMM its dtype's rate was measured on, times the layout's."""
        if fp8:
            shape = self._shape_efficiency(m, n, k, batch, FP8_K_HALF_SCALE) / self._reference_efficiency_fp8
        else:
            shape = self._shape_efficiency(m, n, k, batch) / self._reference_efficiency
        return shape * self._layout_efficiency(m, n, k, layout, tunable)

    def _layout_efficiency(self, m: int, n: int, k: int, layout: str, tunable: bool) -> float:
        """A tunable GEMM gets the best layout (AxoNN times them all in its first batch)."""
        dev = self.device
        if min(m, n, k) < dev.layout_penalty_min_dim:
            return 1.0
        if tunable:
            return max(dev.layout_efficiency.values())
        return dev.layout_efficiency[layout]

    def _measured(self, m: int, n: int, k: int, layout: str, batch: int = 1) -> float:
        """The nearest measurement (its layout first, then batched or not as this GEMM is), carried to (m, n, k,
        layout, batch) by the model's ratio: a batched launch of small products runs unlike one product of their
        size, so it is carried from a batched measurement where there is one."""
        near = min(self.device.gemm_measured,
                   key=lambda e: (e.layout != layout, (e.batch > 1) != (batch > 1), _log_distance(e, m, n, k, batch)))
        measured = near.flop_per_s / self.device.empirical_gemm_flop_per_s
        return measured * self._modelled(m, n, k, layout, False, batch) / self._modelled(
            near.m, near.n, near.k, near.layout, False, near.batch)

    def gemm_memory_s(self, gemm: Gemm) -> float:
        """The floor under a GEMM's time: streaming its operands (2 bytes each, 1 in FP8) and its 2-byte result
        through HBM once."""
        dev = self.device
        operand = 1 if gemm.dtype == FP8 else 2
        operand_bytes = gemm.batch * (operand * (gemm.m * gemm.k + gemm.k * gemm.n) + 2 * gemm.m * gemm.n)
        return operand_bytes / (dev.hbm_bw_bytes_per_s * dev.hbm_efficiency)

    def gemm_time_s(self, gemm: Gemm) -> float:
        dev = self.device
        rate = dev.empirical_gemm_fp8_flop_per_s if gemm.dtype == FP8 else dev.empirical_gemm_flop_per_s
        if not rate:
            raise TwinError(f"an FP8 GEMM on {dev.name}, whose machine file gives no FP8 rate "
                            "(device.empirical_gemm_fp8_tflop_per_s); use fp8=0 or add it")
        flop_time = gemm.flops / (rate * self.gemm_efficiency(gemm))
        return max(flop_time, self.gemm_memory_s(gemm)) + dev.kernel_overhead_s

    def _duration_s(self, work: Work) -> float:
        dev = self.device
        if isinstance(work, Gemm):
            return self.gemm_time_s(work)
        if isinstance(work, Attention):
            rate = dev.empirical_gemm_flop_per_s * dev.attention_efficiency
            return work.flops / rate + dev.kernel_overhead_s + dev.attention_overhead_s
        if isinstance(work, Elementwise):
            return work.nbytes / (dev.hbm_bw_bytes_per_s * dev.hbm_efficiency) + work.kernels * dev.kernel_overhead_s
        raise TypeError(f"not a compute op: {type(work).__name__}")


def _log_distance(e: GemmMeasurement, m: int, n: int, k: int, batch: int = 1) -> float:
    """How far apart two GEMM shapes are, as sizes scale: |ln m/m'| + |ln n/n'| + |ln k/k'| + |ln batch/batch'|."""
    return abs(log(e.m / m)) + abs(log(e.n / n)) + abs(log(e.k / k)) + abs(log(e.batch / batch))
