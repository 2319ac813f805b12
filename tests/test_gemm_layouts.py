"""GEMM layouts: which product Frontier's slow rocBLAS kernel slows (the forward, x W^T, the twin's NT and AxoNN's
TN), which GEMMs a tuned plan re-lays (under axonn only those AxoNN's tuner times), and the renamed threshold."""

from __future__ import annotations

from pathlib import Path

import pytest

from topologies import load_machine
from topologies.errors import InputError
from twin.builders.schedule import build_schedule
from twin.ir import Gemm
from twin.model import parse_model_spec
from twin.sim.compute import ComputeModel

from helpers import valid_plan

GPT = parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024")
FRONTIER_FILE = Path(__file__).resolve().parent.parent / "topologies" / "frontier.toml"
BIG, SMALL = 16384, 4096  # above and below Frontier's layout_penalty_min_dim (8192)


@pytest.fixture(scope="module")
def frontier_compute() -> ComputeModel:
    return ComputeModel(load_machine("frontier").device)


def test_frontiers_slow_layout_is_the_forward_product(frontier_compute):
    """The forward's x W^T (NT) runs at 6/55 of the best layout on large GEMMs, untuned; the weight gradient's
    dY^T X (TN) and the input gradient's dY W (NN) at par; a tuned forward takes the best layout."""
    eff = frontier_compute.gemm_efficiency
    forward, weight_grad, input_grad = (Gemm(BIG, BIG, BIG, layout) for layout in ("NT", "TN", "NN"))
    assert eff(forward) / eff(input_grad) == pytest.approx(6 / 55, abs=1e-3)
    assert eff(weight_grad) == pytest.approx(eff(input_grad))
    assert eff(Gemm(BIG, BIG, BIG, "NT", tunable=True)) == pytest.approx(eff(input_grad))


def test_no_layout_penalty_below_the_threshold(frontier_compute):
    eff = frontier_compute.gemm_efficiency
    assert eff(Gemm(BIG, BIG, SMALL, "NT")) == pytest.approx(eff(Gemm(BIG, BIG, SMALL, "NN")))


def gemm_tunability(text: str) -> dict[tuple[bool, str], set[bool]]:
    """{(in a layer, GEMM role): the tunable flags its GEMMs carry} over rank 0's step."""
    found: dict[tuple[bool, str], set[bool]] = {}
    for op in build_schedule(GPT, valid_plan(text, GPT, 4)).programs[0].ops:
        if isinstance(op.work, Gemm) and op.work.batch == 1:  # attention's batched products are never tuned
            found.setdefault((op.tag.layer is not None, op.tag.role), set()).add(op.work.tunable)
    return found


def test_axonn_tunes_only_its_linears_forward_and_input_gradient():
    """axonn-ai/axonn's tuned_matmul times its Linear's forward and input-gradient products; the weight gradient
    and Megatron's own LM head run as torch issues them."""
    found = gemm_tunability("gz=4,mbs=1,ga=1,recompute=full,axonn=1")
    assert found[(True, "gemm")] == {True} and found[(True, "dI")] == {True}
    assert found[(True, "dW")] == {False}
    assert {flag for (in_layer, _), flags in found.items() if not in_layer for flag in flags} == {False}


def test_other_plans_tune_every_linear_gemm_and_tune0_none():
    tuned = gemm_tunability("gz=4,mbs=1,ga=1,recompute=full")
    assert {flag for flags in tuned.values() for flag in flags} == {True}
    assert {(in_layer, "dW") for in_layer in (True, False)} & set(tuned)
    untuned = gemm_tunability("gz=4,mbs=1,ga=1,recompute=full,axonn=1,tune=0")
    assert {flag for flags in untuned.values() for flag in flags} == {False}


def test_the_former_threshold_name_is_refused_with_its_new_name(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text(FRONTIER_FILE.read_text().replace("layout_penalty_min_dim", "tn_penalty_min_dim"))
    with pytest.raises(InputError, match="tn_penalty_min_dim.*renamed layout_penalty_min_dim"):
        load_machine(str(path))
