"""AxoNN's own communication model (paper sec. V-B, algorithms.md section 3), to compare rankings with.

AxoNN picked the configuration of each published run by ranking every
power-of-two (G_x, G_y, G_z, G_data) with this model (ring collectives,
latency and compute ignored, one measured bandwidth per group level) and then
running its top 10-20 for real. The twin ranks by simulated step time
instead. Reproducing AxoNN's model lets a benchmark say how far the two
rankings agree and how much slower, in the twin, AxoNN's first choice is than
the twin's (benchmarks/ranking_axonn_model.py). It is not used to rank
anything in `twin search`.

Per linear (k inputs, n outputs, m rows of the data-parallel replica's
batch), in elements times bytes per element, over each group's bandwidth:

    t_AG,z    = (G_z-1) k n / (G_x G_y G_z) / b_z
    t_RS,z    = ((G_z-1)/G_z) k n / (G_x G_y) / b_z
    t_AR,y    = 2 ((G_y-1)/G_y) m n / (G_z G_x) / b_y
    t_AR,x    = 2 ((G_x-1)/G_x) m k / (G_z G_y) / b_x
    t_AR,data = 2 ((G_data-1)/G_data) k n / (G_x G_y G_z) / b_data

for a linear whose k is split over Y and n over X; the transposed ones
split k over X and n over Y, so their forward all-reduce runs over X and
their backward one over Y (G_x and G_y swap). Each group's bandwidth comes
from the table by its place in the nesting, X innermost.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.errors import TwinError
from twin.model import ModelSpec

GB = 1e9
BYTES_PER_ELEMENT = 2  # bf16
# Minimum tensor-parallel size (G_x G_y G_z) per model in AxoNN's launcher (algorithms.md section 3); larger
# models are limited by memory alone.
MIN_TP = {"GPT-5B": 4, "GPT-10B": 8, "GPT-20B": 16, "GPT-40B": 32, "GPT-60B": 64, "GPT-80B": 64, "GPT-160B": 128}
# AxoNN ran the top 10-20 of its model's ranking for real and kept the fastest (paper sec. V-B); its launcher
# for the paper's Perlmutter runs submits the top 20 (axonn-ai/Megatron-AxoNN, branch gordon-bell-perlmutter at
# 885d2e7, examples/launch_per_comm_model.py: topk=20, the comm model's "v2"), so the twin predicts its runs from
# the top 20. (It was 10 until the thirty-sixth session: the list AxoNN validated its model on, 9 of them among the 10
# fastest measured).
MEASURED_TOP = 20


def model_bandwidth_gb_per_s(machine: str, inner: int, own: int) -> float:
    """The bandwidth AxoNN's model gives a group of `own` ranks at rank stride `inner` (algorithms.md
    section 3; Megatron-AxoNN examples/comm_model.py get_bw, the model's rounded values)."""
    if machine == "perlmutter":
        if inner == 1:
            return {2: 76.0, 4: 225.0}.get(own, 80.0)
        if inner == 2:
            return 76.0 if own == 2 else 40.0
        return 20.0
    if machine == "frontier":
        if inner == 1:
            return {2: 129.0, 4: 52.0, 8: 135.0}.get(own, 40.0)
        if inner == 2:
            return {2: 50.0, 4: 72.0}.get(own, 20.0)
        if inner == 4:
            return 36.0 if own == 2 else 10.0
        return 5.0
    raise TwinError(f"AxoNN's communication model has bandwidth tables for frontier and perlmutter only, not {machine!r}")


@dataclass(frozen=True)
class Grid:
    gx: int
    gy: int
    gz: int
    gdata: int

    def describe(self) -> str:
        return f"gx={self.gx},gy={self.gy},gz={self.gz},gdata={self.gdata}"


def comm_time_s(model: ModelSpec, grid: Grid, global_batch: int, machine: str) -> float:
    """AxoNN's modelled communication time of one step: every layer's four linears."""
    gx, gy, gz, gd = grid.gx, grid.gy, grid.gz, grid.gdata
    bw = {}
    inner = 1
    for axis, size in (("x", gx), ("y", gy), ("z", gz), ("data", gd)):
        if size > 1:
            bw[axis] = model_bandwidth_gb_per_s(machine, inner, size) * GB
        inner *= size
    m = global_batch * model.seq / gd
    size = {"x": gx, "y": gy}
    total = 0.0
    for _, k, n, transposed in model.linear_shapes():
        k_axis, n_axis = ("x", "y") if transposed else ("y", "x")  # which group splits k and which n
        t = 0.0
        if gz > 1:
            t += (gz - 1) * k * n / (gx * gy * gz) / bw["z"]  # all-gather of the weights
            t += (gz - 1) / gz * k * n / (gx * gy) / bw["z"]  # reduce-scatter of their gradients
        if size[k_axis] > 1:  # forward: the output's partial sums over the group that splits k
            g = size[k_axis]
            t += 2 * (g - 1) / g * m * n / (gz * size[n_axis]) / bw[k_axis]
        if size[n_axis] > 1:  # backward: the input gradient's partial sums over the group that splits n
            g = size[n_axis]
            t += 2 * (g - 1) / g * m * k / (gz * size[k_axis]) / bw[n_axis]
        if gd > 1:
            t += 2 * (gd - 1) / gd * k * n / (gx * gy * gz) / bw["data"]
        total += t
    return total * BYTES_PER_ELEMENT * model.layers
