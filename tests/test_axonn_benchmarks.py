"""benchmarks/layout_slowdown.py's split of GPT-320B's GEMM time and benchmarks/axonn_cache.py's memory search."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from axonn_cache import most_cached, weak_scaling  # noqa: E402
from layout_slowdown import BLOCKS, gemm_seconds, main, slowed_seconds  # noqa: E402

from topologies.machine import load_machine  # noqa: E402
from twin.build import resolve_step  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.published import AXONN_BATCH_SEQUENCES  # noqa: E402


def test_a_guess_names_a_product_in_every_pass_or_in_one():
    seconds = {("mlp_up", "gemm", "fwd"): 1.0, ("mlp_up", "gemm", "rc"): 2.0, ("mlp_up", "dI", "bwd"): 4.0,
               ("qkv", "gemm", "fwd"): 8.0}
    assert slowed_seconds(seconds, (("mlp_up", "gemm"),)) == 3.0
    assert slowed_seconds(seconds, (("mlp_up", "gemm", "rc"),)) == 2.0
    assert slowed_seconds(seconds, (("mlp_up", "gemm"), ("qkv", "gemm"))) == 11.0
    assert slowed_seconds(seconds, (("attn_out", "gemm"),)) == 0.0


def test_gpt320b_forward_products_split_as_the_linears_work():
    # gx=32 shards every linear alike; the forward product runs in the forward and the recompute, each linear's about
    # in proportion to its weights (qkv 3h^2, attn_out h^2, mlp_up and mlp_down 4h^2), as its shape's efficiency allows
    plan = "gx=32,gy=1,gz=32,gdata=32,axonn=1,mbs=8,ga=1"
    seconds, compute = gemm_seconds(load_machine("frontier"), plan)
    forward = {b: slowed_seconds(seconds, ((b, "gemm"),)) for b in BLOCKS}
    assert set(p for (_, _, p) in seconds) >= {"fwd", "rc", "bwd"}
    # the same products in the first forward and the recompute, the recompute's slowed by the gathers it overlaps
    first = slowed_seconds(seconds, tuple((b, "gemm", "fwd") for b in BLOCKS))
    again = slowed_seconds(seconds, tuple((b, "gemm", "rc") for b in BLOCKS))
    assert first <= again <= first * (1 + load_machine("frontier").device.comm_compute_slowdown)
    assert forward["mlp_up"] / forward["qkv"] == pytest.approx(4 / 3, rel=0.15)  # both of inner dimension h
    assert forward["mlp_up"] == pytest.approx(forward["mlp_down"], rel=0.15)
    assert min(forward, key=forward.get) == "attn_out"  # h^2 weights, and an inner dimension of h / 32
    assert sum(forward.values()) < sum(seconds.values()) < compute


def test_an_unknown_machine_is_one_line_and_exit_2():
    with pytest.raises(SystemExit) as exit_:
        main(["--machine", "no-such-machine.toml"])
    assert exit_.value.code == 2


def test_most_cached_is_the_last_layer_count_that_fits():
    plan = "gx=1,gy=1,gz=8,gdata=1,axonn=1,mbs=1"
    model, machine = get_model("GPT-20B"), load_machine("frontier")
    cached = most_cached("frontier", "GPT-20B", 8, plan)

    def fits(layers: int) -> bool:
        try:
            resolve_step(model, parse_plan(f"{plan},cache={layers},global_batch={AXONN_BATCH_SEQUENCES}"),
                         machine, 8)
            return True
        except TwinError:
            return False

    assert 0 < cached < model.layers  # the case is one where memory decides
    assert fits(cached) and not fits(cached + 1)


def test_weak_scaling_is_the_per_gcd_rate_at_8192_over_512_with_and_without_the_cache():
    def row(gpus, fp, fp_cached, cal, cal_cached):
        return {"machine": "frontier", "gpus": gpus,
                "first principles": {"pflops": fp, "cached_pflops": fp_cached},
                "calibrated": {"pflops": cal, "cached_pflops": cal_cached}}
    rows = [row(512, 40.0, 80.0, 44.0, 44.0), row(8192, 320.0, 320.0, 176.0, 211.2),
            {"machine": "perlmutter", "gpus": 512}]
    weak = weak_scaling(rows)
    assert weak["first principles"] == pytest.approx({"none": 50.0, "cached": 25.0})  # 320/8192 over 40/512
    assert weak["calibrated"] == pytest.approx({"none": 25.0, "cached": 30.0})
