"""A deep pipeline continued from short ones (twin.pipeline_depth) equals the full simulation.

Each case simulates the whole step (every micro-batch, every stage) and
compares the shortcut's step time, executed FLOPs and throughput with it, to
1e-6 relative, and the critical rank's exposed communication and busy time
per op class, which the shortcut continues approximately and says so, to 1%.
The cases cover a stage per node, data parallelism across nodes (its
gradient all-reduce shares the NICs with the pipeline's transfers during the
drain), a boundary across a fat tree's spine, Frontier's dragonfly with
ZeRO-1, a host-bound machine (a fitted launch interval) and more
micro-batches than stages by far; and the cases the shortcut must refuse:
stages that share a node (their boundaries alternate between NVLink and the
network), step times off the plane, interleaved schedules and pipelines too
shallow to gain.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from topologies.machine import load_machine
from twin.build import build_step, resolve_step
from twin.model import get_model
from twin.plan import parse_plan
from twin import pipeline_depth
from twin.pipeline_depth import MIN_DEPTH, applies, short_pipelines, simulate_deep
from twin.report import summarize
from twin.sim.engine import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
# the cases (a 1-layer-per-stage test model) as benchmarks/depth_shortcut_sweep.py builds them; ONE_LEAF: 32 nodes
# under one leaf switch, so that no stage boundary crosses the spine
from depth_shortcut_sweep import ONE_LEAF, case as _case  # noqa: E402
from interleaved_depth import linear_from, main as interleaved_depth  # noqa: E402

FITTED_A100 = "topologies/fitted/dgx-a100-800g.toml"
SHIPPED_SAVING = pipeline_depth.SAVING


@pytest.fixture(autouse=True)
def any_cost(monkeypatch):
    """The cases are shallow to keep the full simulations they are checked against quick, and the short
    pipelines would cost more than the steps they stand for: let them (test_shallow_... checks the limit)."""
    monkeypatch.setattr(pipeline_depth, "SAVING", 0.01)



@pytest.mark.parametrize("machine, plan, pp, ga, layers, overrides", [
    ("dgx-a100", "tp=8,dp=1", 12, 15, 2, ()),           # one stage per node
    ("dgx-a100", "tp=8,dp=2", 16, 17, 1, (ONE_LEAF,)),  # DP over two nodes: all-reduces share NICs with transfers
    ("dgx-a100", "tp=8,dp=2", 12, 13, 1, ()),           # 24 nodes on leaves of 20: one boundary crosses the spine
    ("frontier", "tp=4,dp=2,zero=1", 16, 17, 1, ()),    # ZeRO-1 on Frontier's dragonfly, boundaries across switches
    (FITTED_A100, "tp=8,dp=1", 12, 30, 1, ()),          # a host thread (fitted launch interval)
    ("dgx-a100", "tp=8,dp=1", 12, 60, 1, ()),           # many more micro-batches than stages
    # Frontier, stages of four nodes (a switch each) on two dragonfly groups: boundaries between some switches
    # are slower than between others (three kinds of stage), and the tied embedding's sum between the end stages
    # crosses the groups (the short pipelines are seamed); as many micro-batches as stages (1T on 4,096 GCDs)
    ("frontier", "tp=4,dp=8,zero=1", 40, 41, 1, ()),
    ("frontier", "tp=4,dp=8,zero=1", 40, 40, 1, ()),
])
def test_shortcut_equals_full_simulation(machine, plan, pp, ga, layers, overrides):
    """Step time, FLOPs and throughput exact; the critical rank's diagnostics within 1% and said to be
    approximate."""
    model, resolved, m, gpus = _case(machine, plan, pp, ga, layers, *overrides)
    deep = simulate_deep(model, resolved, m, gpus)
    assert deep is not None, "the shortcut should apply to uniform stages"
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    assert deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)
    assert deep.flops_executed == pytest.approx(full.flops_executed, rel=1e-6)
    assert deep.pflops_total == pytest.approx(full.pflops_total, rel=1e-6)
    assert deep.formula_pflops_total == pytest.approx(full.formula_pflops_total, rel=1e-6)
    assert (deep.gpus, deep.global_batch, deep.plan) == (full.gpus, full.global_batch, full.plan)
    assert "approximate" in deep.continued and not full.continued
    assert deep.exposed_comm_s == pytest.approx(full.exposed_comm_s, rel=1e-2, abs=1e-9)
    assert set(deep.time_by_class_s) == set(full.time_by_class_s)
    for k, v in full.time_by_class_s.items():
        assert deep.time_by_class_s[k] == pytest.approx(v, rel=1e-2, abs=1e-3 * full.step_time_s), k


def test_shortcut_keeps_end_stages_that_hold_fewer_layers():
    """pemb=1, ploss=1 (Llama 3's split): the first and last stages hold one layer fewer than the interior ones;
    the short pipelines keep them so, and the step is the full simulation's."""
    model, _, m, gpus = _case("dgx-a100", "tp=8,dp=1", 12, 13, 2)
    model = replace(model, layers=2 * 12 - 2)
    plan = replace(parse_plan("tp=8,dp=1,pp=12,pemb=1,ploss=1,mbs=1,ga=13"), global_batch=13)
    resolved, _ = resolve_step(model, plan, m, gpus)
    deep = simulate_deep(model, resolved, m, gpus)
    assert deep is not None
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    assert deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)
    assert deep.flops_executed == pytest.approx(full.flops_executed, rel=1e-6)


def test_stages_next_to_the_ends_may_differ(monkeypatch):
    """Frontier, one dragonfly group per stage, GPT-80B's layers: the last stage's own end-of-step collectives
    (its data-parallel all-reduce, in another protocol for the LM head's size; the tied embedding's sum with the
    first stage) load links that its neighbour's transfers cross, so the stages next to the ends differ from the
    interior ones. They are matched against the short pipelines' own neighbours of the ends, and the shortcut
    is exact; comparing only the first and last stages (as before) refused it. The transfers are whole on every
    tensor-parallel rank (p2p=full: eight times the bytes of Megatron's split ones, which do not load those
    links enough to tell the stages apart)."""
    m = load_machine("frontier")
    model = replace(get_model("GPT-80B"), layers=12)
    plan = replace(parse_plan("tp=8,dp=128,pp=12,mbs=1,ga=13,p2p=full"), global_batch=13 * 128)
    resolved, _ = resolve_step(model, plan, m, 12288)
    deep = simulate_deep(model, resolved, m, 12288)
    assert deep is not None
    full = summarize(simulate(build_step(model, resolved, m, 12288).schedule, m))
    assert deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)
    assert deep.flops_executed == pytest.approx(full.flops_executed, rel=1e-6)
    monkeypatch.setattr(pipeline_depth, "ENDS", 1)
    assert short_pipelines(model, resolved, m, 12288) is None


def _minimal(machine):
    """The machine with minimal routing: inside a dragonfly group every transfer between two switches on their one
    direct link, where adaptive routing pools a switch's links (topologies/networks/dragonfly.py). The stages that
    straddle switches in different ways, which the kinds below tell apart, exist only there."""
    return replace(machine, network=replace(machine.network, routing="minimal"))


def test_kinds_found_deep_in_the_pipeline():
    """Perlmutter with minimal routing, stages of two nodes: the short pipelines whose stages match the full one's
    are 11 stages and deeper, and tell its three kinds apart only at 19 stages; exact all the same."""
    model, resolved, m, gpus = _case("perlmutter", "tp=4,dp=2", 40, 41)
    m = _minimal(m)
    short = short_pipelines(model, resolved, m, gpus)
    assert short is not None and len(short.target) == 2 + 3 and max(p.depth for p in short.points) >= 19
    deep = simulate_deep(model, resolved, m, gpus)
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    assert deep is not None and deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)
    # the ranks simulated are the short pipelines', all of them (as sim_wall_s is their simulations' wall time)
    per_stage = full.simulated_ranks // resolved.pp
    assert deep.simulated_ranks == per_stage * sum(p.depth for p in short.points)


@pytest.mark.slow
@pytest.mark.parametrize("machine, plan, pp, ga", [
    ("frontier", "tp=4,dp=8,zero=1", 48, 49),   # three dragonfly groups (three kinds, seamed, before the local pools)
    ("frontier", "tp=8,dp=4,zero=1", 40, 41),   # the same with tp=8
    ("frontier", "tp=2,dp=8", 40, 41),          # stages of two nodes: one kind
    ("alps", "tp=4,dp=2", 40, 41),              # three kinds on Alps' dragonfly
    ("dgx-a100", "tp=8,dp=3", 40, 40),          # a fat tree's spine crossed, as many micro-batches as stages
])
def test_shortcut_equals_full_simulation_across_machines(machine, plan, pp, ga):
    """More machines and stage sizes than the default cases (the sweep behind docs/speed.md's stages of several
    kinds): each continued in depth, and exact."""
    model, resolved, m, gpus = _case(machine, plan, pp, ga)
    deep = simulate_deep(model, resolved, m, gpus)
    assert deep is not None
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    assert deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)
    assert deep.flops_executed == pytest.approx(full.flops_executed, rel=1e-6)


@pytest.mark.slow
def test_a_case_whose_extra_point_is_weak_is_refused_or_exact():
    """Alps, stages of three nodes (four interior kinds, two pairs met only at 8 and 19 stages): the extra point
    checks one more stage of the commonest kind and one more micro-batch, not the rarer kinds' coefficients.
    With the short pipelines starting at 4 or 5 stages this case passed it and came out 8.1e-4 off the full
    simulation (tried: docs/speed.md); from SHORT stages its extra point fails and the shortcut is refused.
    Whatever SHORT is, the shortcut must never return a step off the full simulation."""
    model, resolved, m, gpus = _case("alps", "tp=4,dp=3", 40, 41)
    deep = simulate_deep(model, resolved, m, gpus)
    if deep is not None:
        full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
        assert deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)


def test_stages_that_differ_only_in_link_shares_are_refused_unless_asked():
    """Frontier with minimal routing, stages of three nodes (they straddle switches in several ways): kinds that
    cost the same alone and differ only in the shares of the links they load. The default refuses them; with share_kinds (never the
    default) the continuation runs and is 2e-4 off the full simulation at 32 stages: not exact, which is why it
    is refused (benchmarks/depth_share_kinds.py measures the same on frontier-1t-3072)."""
    model, resolved, m, gpus = _case("frontier", "tp=4,dp=6", 32, 33)
    m = _minimal(m)
    assert short_pipelines(model, resolved, m, gpus) is None
    assert simulate_deep(model, resolved, m, gpus) is None
    deep = simulate_deep(model, resolved, m, gpus, share_kinds=True)
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    assert deep is not None
    assert deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-3)
    assert deep.step_time_s != pytest.approx(full.step_time_s, rel=1e-6)


def test_seamed_short_pipelines_run_on_the_full_pipelines_end_nodes():
    """A seamed short pipeline's last ENDS stages are the full pipeline's last ones, on their nodes. (This pipeline
    needed seaming before adaptive routing pooled the links inside a group; it is one kind now, and minimal
    routing refuses it.)"""
    model, resolved, m, gpus = _case("frontier", "tp=4,dp=8,zero=1", 40, 41)
    per_stage = gpus // 40
    on = pipeline_depth.seamed_gpus(resolved, gpus, 7)
    assert on[:5 * per_stage] == list(range(5 * per_stage))
    assert on[5 * per_stage:] == list(range(38 * per_stage, 40 * per_stage))


def test_shortcut_equals_per_rank_simulation():
    """Against the simulation of every rank (no symmetry reduction), not only the class-reduced one."""
    model, resolved, m, gpus = _case("dgx-a100", "tp=8,dp=2", 12, 13, 1, ONE_LEAF)
    deep = simulate_deep(model, resolved, m, gpus)
    full = simulate(build_step(model, resolved, m, gpus).schedule, m, full=True)
    assert deep is not None and deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)


def test_stages_sharing_a_node_are_refused():
    """tp=2 on 8-GPU nodes: four stages per node, so boundaries alternate between NVLink and the network."""
    model, resolved, m, gpus = _case("dgx-a100", "tp=2,dp=1", 12, 16)
    assert short_pipelines(model, resolved, m, gpus) is None
    assert simulate_deep(model, resolved, m, gpus) is None


@pytest.mark.parametrize("plan, pp, ga", [("tp=2,dp=8", 12, 14), ("tp=4,dp=6,zero=1", 40, 41)])
def test_kinds_that_differ_only_in_link_shares_are_refused(plan, pp, ga):
    """Frontier with minimal routing, stages of two and of three nodes: some boundaries and data-parallel groups
    cross between switches over links that other traffic also loads (their shares add up to a whole link), others do not, so
    stages that cost the same alone differ in what they share. A short pipeline cannot tell such kinds apart
    (shares are not comparable across jobs), and the stages' contributions to the step interact: allowed to
    fit one number per kind, the second case's 40 stages came out 2.9e-4 off the full simulation (tried)."""
    model, resolved, m, gpus = _case("frontier", plan, pp, ga)
    assert short_pipelines(model, resolved, _minimal(m), gpus) is None


@pytest.mark.parametrize("machine, plan, pp, ga", [("frontier", "tp=4,dp=6", 32, 33),
                                                   ("perlmutter", "tp=4,dp=2", 40, 41)])
def test_under_adaptive_routing_the_straddling_stages_are_one_kind(machine, plan, pp, ga):
    """The machine files' adaptive routing pools each switch's links inside a group, so stages that straddle
    switches in different ways load the same pools: one kind, and the shortcut is exact."""
    model, resolved, m, gpus = _case(machine, plan, pp, ga)
    short = short_pipelines(model, resolved, m, gpus)
    assert short is not None and len(short.target) == 2 + 1
    deep = simulate_deep(model, resolved, m, gpus)
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    assert deep is not None and deep.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)


def test_non_planar_steps_are_refused(monkeypatch):
    """The fourth point must lie on the plane of the first three: a step time off it turns the shortcut off."""
    model, resolved, m, gpus = _case("dgx-a100", "tp=8,dp=1", 12, 15)
    real = pipeline_depth.summarize

    def bent(run, flops_formula="hardware"):
        s = real(run, flops_formula)
        return replace(s, step_time_s=s.step_time_s * (1 + 1e-6 * (s.gpus == 8 * (pipeline_depth.SHORT + 2))))

    monkeypatch.setattr(pipeline_depth, "summarize", bent)
    assert simulate_deep(model, resolved, m, gpus) is None


def test_shallow_interleaved_and_short_batches_are_left_alone(monkeypatch):
    model, resolved, m, gpus = _case("dgx-a100", "tp=8,dp=1", MIN_DEPTH - 1, 12)
    assert not applies(resolved)
    monkeypatch.setattr(pipeline_depth, "SAVING", SHIPPED_SAVING)
    model, resolved, m, gpus = _case("dgx-a100", "tp=8,dp=1", 16, 17)
    assert applies(resolved) and short_pipelines(model, resolved, m, gpus) is None  # 218 of the step's 272 (SAVING 2)
    model, resolved, m, gpus = _case("dgx-a100", "tp=8,dp=1", 16, 40)
    assert short_pipelines(model, resolved, m, gpus) is not None  # of twin.micro_batches' 16 x (17 + 18)
    model, resolved, m, gpus = _case("dgx-a100", "tp=8,dp=1", 12, 11)  # ga < pp: stages skip their warm-up
    assert not applies(resolved)
    assert not applies(replace(resolved, vpp=2, ga=24))


def test_depth_increments_benchmark_prints_each_added_stage():
    """benchmarks/depth_increments.py, which the refusal of share-only kinds cites, runs (here on 9 stages)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from depth_increments import main

    rows = main(["--depth", "9", "--json"])
    assert [r["depth"] for r in rows] == [7, 8, 9]
    assert [r["stage_added"] for r in rows] == [4, 5, 6]
    assert all(r["increment_s"] > 0 for r in rows)


def test_depth_shortcut_sweep_benchmark_compares_with_the_full_simulation():
    """benchmarks/depth_shortcut_sweep.py, which docs/speed.md cites, runs (here one case) and leaves the module's
    constants as shipped."""
    from depth_shortcut_sweep import main

    shipped = pipeline_depth.SHORT, pipeline_depth.MIN_DEPTH
    rows = main(["--case", "3", "--short", "5", "--json"])
    assert (pipeline_depth.SHORT, pipeline_depth.MIN_DEPTH) == shipped
    assert len(rows) == 1 and not rows[0]["refused"] and rows[0]["relative_error"] < 1e-6
    assert rows[0]["depths"][0] == 5


def test_interleaved_depth_finds_where_the_step_turns_linear():
    """benchmarks/interleaved_depth.py, why interleaved plans have no depth continuation (docs/speed.md): the
    depth from which every second difference is zero, and on a DGX A100 cluster at vpp=2 a step linear in depth."""
    depths = [4, 5, 6, 7, 8]
    assert linear_from(depths, np.array([1e-3, 0.0, 1e-12])) == 5
    assert linear_from(depths, np.array([0.0, 0.0, 0.0])) == 4
    assert linear_from(depths, np.array([0.0, 0.0, 1e-6])) is None
    [row] = interleaved_depth(["--machines", "dgx-a100", "--vpp", "2", "--depths", "4-6", "--json"])
    assert row["depths"] == [4, 5, 6] and len(row["second_difference_rel"]) == 1
    assert row["linear_from_depth"] == 4
