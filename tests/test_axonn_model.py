"""AxoNN's communication model (algorithms.md section 3), reproduced to compare the twin's ranking with."""

from __future__ import annotations

import pytest

from twin.errors import TwinError
from twin.model import parse_model_spec
from twin.search.axonn_model import Grid, comm_time_s, model_bandwidth_gb_per_s

MODEL = parse_model_spec("layers=2,hidden=512,heads=8,seq=128,vocab=1024")  # h = 512, ffn = 4h
H, L, SEQ, BATCH = 512, 2, 128, 64


def test_bandwidth_table_is_algorithms_md():
    assert model_bandwidth_gb_per_s("frontier", 1, 8) == 135
    assert model_bandwidth_gb_per_s("frontier", 1, 64) == 40
    assert model_bandwidth_gb_per_s("frontier", 4, 2) == 36
    assert model_bandwidth_gb_per_s("frontier", 16, 4) == 5
    assert model_bandwidth_gb_per_s("perlmutter", 1, 4) == 225
    assert model_bandwidth_gb_per_s("perlmutter", 2, 8) == 40
    with pytest.raises(TwinError, match="frontier and perlmutter"):
        model_bandwidth_gb_per_s("alps", 1, 2)


def test_one_gpu_and_pure_data_parallelism_by_hand():
    assert comm_time_s(MODEL, Grid(1, 1, 1, 1), BATCH, "frontier") == 0
    weights = 12 * H * H  # the four linears of a block: 3h^2 + h^2 + 4h^2 + 4h^2
    want = L * 2 * (3 / 4) * weights * 2 / 52e9  # ring all-reduce over 4 ranks at the table's 52 GB/s
    assert comm_time_s(MODEL, Grid(1, 1, 1, 4), BATCH, "frontier") == pytest.approx(want)


def test_transposed_linears_swap_the_x_and_y_roles():
    """gx = 2: the column-parallel linears all-reduce dI (m x k) over X in the backward, the transposed ones
    O (m x n) in the forward; the Y group has size 1 and costs nothing."""
    m = BATCH * SEQ
    ks_untransposed = H + H  # qkv and mlp_up: k = h
    ns_transposed = H + H  # attn_out and mlp_down: n = h
    want = L * 2 * (1 / 2) * m * (ks_untransposed + ns_transposed) * 2 / 129e9
    assert comm_time_s(MODEL, Grid(2, 1, 1, 1), BATCH, "frontier") == pytest.approx(want)
    # gy = 2 instead: the other halves (forward of the column-parallel, backward of the transposed ones),
    # n = 3h and 4h, k = h and 4h, over the same 129 GB/s (Y is innermost when X is 1)
    want_y = L * 2 * (1 / 2) * m * ((3 * H + 4 * H) + (H + 4 * H)) * 2 / 129e9
    assert comm_time_s(MODEL, Grid(1, 2, 1, 1), BATCH, "frontier") == pytest.approx(want_y)


def test_depth_groups_gather_and_scatter_the_weights():
    weights = 12 * H * H
    gz = 4
    want = L * ((gz - 1) * weights / gz + (gz - 1) / gz * weights) * 2 / 52e9
    assert comm_time_s(MODEL, Grid(1, 1, gz, 1), BATCH, "frontier") == pytest.approx(want)
