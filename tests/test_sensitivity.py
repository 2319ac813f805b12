"""What-if machine numbers (--set) and the sensitivity of a step to each number of the machine file."""

from __future__ import annotations

import json

import pytest

from helpers import SMALL_SPEC
from test_cli import STEP, assert_user_error, run
from topologies.machine import load_machine
from twin.errors import TwinError
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.search.cache import machine_text
from twin.sensitivity import estimated_fields, sensitivity

MODEL = parse_model_spec(SMALL_SPEC)
# one node, no pipeline: a step with tensor-parallel collectives inside a Frontier node only
PLAN = parse_plan("gx=2,gy=2,gz=2,mbs=2,global_batch=8")
GEMM_PEAK = "device.empirical_gemm_bf16_tflop_per_s"


# ---- --set ---------------------------------------------------------------------------------


def test_override_replaces_the_number_and_says_so():
    link = "node.links[0].bw_per_direction_gb_per_s"
    m = load_machine("frontier", (("device.attention_efficiency", 0.5), (link, 100)))
    assert m.device.attention_efficiency == 0.5
    assert m.node.links[0].bw_bytes_per_s == 100e9
    note = m.sources["device.attention_efficiency"]
    assert note.source is None and "--set" in note.estimate and "0.4" in note.estimate
    plain = load_machine("frontier")
    assert plain.device.attention_efficiency == 0.4  # the file itself is untouched
    assert machine_text(m) != machine_text(plain)  # cached results of the plain file are not served


def test_a_number_set_twice_takes_the_last_value():
    m = load_machine("frontier", (("device.hbm_efficiency", 0.5), ("device.hbm_efficiency", 0.6)))
    assert m.device.hbm_efficiency == 0.6 and m.overrides == (("device.hbm_efficiency", 0.6),)
    assert "the file says 0.8" in m.sources["device.hbm_efficiency"].estimate


@pytest.mark.parametrize("override, mentions", [
    (("device.atention_efficiency", 0.5), ("no such number", "device.attention_efficiency")),
    (("node.links[99].bw_per_direction_gb_per_s", 1.0), ("no such number",)),
    (("device", 1.0), ("no such number",)),
    (("device.attention_efficiency", 1.5), ("device.attention_efficiency", "(0, 1]", "--set")),
    (("device.gemm_tile_m", 100.5), ("device.gemm_tile_m", "integer")),
])
def test_bad_override_is_a_one_line_error(override, mentions):
    with pytest.raises(TwinError) as e:
        load_machine("frontier", (override,))
    assert "\n" not in str(e.value)
    for text in mentions:
        assert text in str(e.value)


def test_set_on_the_command_line(capsys):
    rc, out, _ = run(capsys, "simulate", *STEP, "--json")
    base = json.loads(out)
    rc, out, _ = run(capsys, "simulate", *STEP, "--json", "--set", f"{GEMM_PEAK}=60")
    slow = json.loads(out)
    assert rc == 0 and slow["machine_overrides"] == {GEMM_PEAK: 60.0} and base["machine_overrides"] == {}
    assert slow["step_time_s"] > base["step_time_s"]
    rc, out, _ = run(capsys, "simulate", *STEP, "--set", f"{GEMM_PEAK}=60")
    assert f"machine file overridden: {GEMM_PEAK}=60" in out


@pytest.mark.parametrize("value, mentions", [
    ("device.hbm_efficiency", ("FIELD=VALUE",)),
    ("device.hbm_efficiency=fast", ("not a number",)),
    ("device.hbm_efficiency=2", ("device.hbm_efficiency", "(0, 1]")),
    ("device.hbm_eficiency=0.5", ("device.hbm_efficiency",)),
])
def test_bad_set_exits_2(capsys, value, mentions):
    assert_user_error(*run(capsys, "simulate", *STEP, "--set", value), *mentions)


# ---- sensitivity ---------------------------------------------------------------------------


def test_elasticities_follow_the_physics():
    machine = load_machine("frontier")
    base = simulate_step(MODEL, PLAN, machine, 8)
    fields = [GEMM_PEAK, "device.attention_efficiency", "network.link_bw_per_direction_gb_per_s", "device.gemm_tile_m"]
    result = sensitivity(MODEL, PLAN, machine, 8, fields)
    by = {f.path: f for f in result.fields}
    assert result.step_time_s == pytest.approx(base.step_time_s)
    gemm_share = base.time_by_class_s["gemm"] / base.step_time_s
    # a faster GEMM shortens the step, by at most the GEMMs' share of it (overlap can hide some of them)
    assert -gemm_share * 1.05 < by[GEMM_PEAK].elasticity < 0
    assert by["device.attention_efficiency"].elasticity < 0
    assert by["network.link_bw_per_direction_gb_per_s"].elasticity == 0  # one node: the network is never used
    tile = by["device.gemm_tile_m"]  # an integer field moves to whole values: 256 -> 205 and 307
    assert (tile.low_value, tile.high_value) == (205, 307)
    sizes = [abs(f.elasticity) for f in result.fields]
    assert sizes == sorted(sizes, reverse=True)


def test_needed_value_reaches_the_target_to_first_order():
    """On a step whose GEMMs carry it (hidden 4096: MODEL's tiny GEMMs sit on the HBM floor and the kernel cost,
    so its step hardly moves with the GEMM rate, and no first-order value reaches 10% on it)."""
    model = parse_model_spec("layers=2,hidden=4096,heads=32,seq=2048,vocab=1024")
    machine = load_machine("frontier")
    base = simulate_step(model, PLAN, machine, 8).step_time_s
    result = sensitivity(model, PLAN, machine, 8, [GEMM_PEAK, "device.attention_efficiency"],
                         target_step_s=1.1 * base)
    gemm = next(f for f in result.fields if f.path == GEMM_PEAK)
    assert gemm.needed_allowed and gemm.needed_value < gemm.value
    moved = load_machine("frontier", ((GEMM_PEAK, gemm.needed_value),))
    assert simulate_step(model, PLAN, moved, 8).step_time_s == pytest.approx(1.1 * base, rel=0.02)
    attention = next(f for f in result.fields if f.path == "device.attention_efficiency")
    # a number only where the step moves with the field at all (|elasticity| > 1e-3: twin.sensitivity)
    assert (attention.needed_value is not None) == (abs(attention.elasticity) > 1e-3)


def test_default_fields_are_the_estimates_and_sides_the_file_rejects_are_skipped():
    machine = load_machine("frontier")
    assert set(estimated_fields(machine)) == {p for p, s in machine.sources.items() if s.estimate and s.value}
    result = sensitivity(MODEL, PLAN, machine, 8, ["device.layout_efficiency.nn"])
    (nn,) = result.fields
    assert nn.high_value is None and "(0, 1]" in nn.skipped and nn.low_value == pytest.approx(0.8)


@pytest.mark.parametrize("kwargs, mentions", [
    ({"fields": ["device.nonsense"]}, ("device.nonsense",)),
    ({"factor": 1.5}, ("--factor",)),
])
def test_sensitivity_input_errors(kwargs, mentions):
    with pytest.raises(TwinError) as e:
        sensitivity(MODEL, PLAN, load_machine("frontier"), 8, **kwargs)
    for text in mentions:
        assert text in str(e.value)


def test_sensitivity_command(capsys, tmp_path):
    step = [a for a in STEP]
    step[step.index("--gpus") + 1], step[step.index("--plan") + 1] = "8", "gx=2,gy=2,gz=2,mbs=2"
    step[step.index("--global-batch") + 1] = "8"
    rc, out, _ = run(capsys, "sensitivity", *step, "--fields", f"{GEMM_PEAK},device.hbm_efficiency",
                     "--target-step-s", "1", "--json")
    doc = json.loads(out)
    assert rc == 0 and {f["path"] for f in doc["fields"]} == {GEMM_PEAK, "device.hbm_efficiency"}
    rc, out, _ = run(capsys, "sensitivity", *step, "--fields", GEMM_PEAK)
    assert rc == 0 and GEMM_PEAK in out and "elasticity" in out
    assert_user_error(*run(capsys, "sensitivity", *step, "--target-step-s", "-1"), "--target-step-s")
    assert_user_error(*run(capsys, "sensitivity", *step, "--fields", ","), "--fields")
    assert_user_error(*run(capsys, "sensitivity", *step, "--fields", GEMM_PEAK, "--all"), "--fields", "--all")
    assert_user_error(*run(capsys, "sensitivity", *step, "--factor", "0"), "--factor")
    assert_user_error(*run(capsys, "sensitivity", *step, "--jobs", "0"), "--jobs")
    figure = tmp_path / "tornado.png"
    rc, out, _ = run(capsys, "sensitivity", *step, "--fields", f"{GEMM_PEAK},device.hbm_efficiency", "--figure",
                     str(figure))
    assert rc == 0 and figure.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and "figure written" in out
    assert_user_error(*run(capsys, "sensitivity", *step, "--figure", str(tmp_path / "no" / "t.png")), "--figure")
    assert_user_error(*run(capsys, "sensitivity", "--machine", "frontier"), "--gpus", "--plan", "--model")


def test_search_and_scale_report_their_overrides(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("EXATWIN_CACHE_DIR", str(tmp_path))
    small = ["--machine", "frontier", "--model-spec", SMALL_SPEC, "--set", "device.attention_efficiency=0.2"]
    rc, out, _ = run(capsys, "search", *small, "--gpus", "8", "--global-batch", "8", "--top", "2", "--json")
    assert rc == 0 and json.loads(out)["machine_overrides"] == {"device.attention_efficiency": 0.2}
    rc, out, _ = run(capsys, "scale", *small, "--plan", "gx=2,mbs=1", "--gpus", "2,4", "--mode", "weak",
                     "--global-batch", "4", "--figure", str(tmp_path / "s.png"))
    assert rc == 0 and "machine file overridden: device.attention_efficiency=0.2" in out


# ---- ranking robustness --------------------------------------------------------------------


def test_ranking_robustness_matches_direct_simulation():
    from twin.sensitivity import format_robustness, ranking_robustness

    machine = load_machine("frontier")
    plans = [parse_plan("gx=2,gy=2,gz=2,mbs=2,global_batch=8"), parse_plan("gx=8,mbs=8,global_batch=8")]
    fields = [GEMM_PEAK, "device.hbm_efficiency"]
    moves = ranking_robustness(MODEL, plans, machine, 8, fields)
    assert [(m.path, round(m.value, 6)) for m in moves] == [(GEMM_PEAK, 100.0), (GEMM_PEAK, 150.0),
                                                            ("device.hbm_efficiency", 0.64),
                                                            ("device.hbm_efficiency", 0.96)]
    for m in moves:
        variant = load_machine("frontier", ((m.path, m.value),))
        steps = [simulate_step(MODEL, p, variant, 8).step_time_s for p in plans]
        best = min(range(2), key=lambda j: steps[j])
        assert m.winner == best and m.regret_pct == pytest.approx(100 * (steps[0] / steps[best] - 1))
    text = format_robustness(moves, ["a", "b"], 0.2)
    assert text.startswith("robustness: each estimate moved by 20% each way, the top 2 re-simulated")


def test_search_robustness_option(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("EXATWIN_CACHE_DIR", str(tmp_path))
    small = ["search", "--machine", "frontier", "--model-spec", SMALL_SPEC, "--gpus", "8", "--global-batch", "8",
             "--top", "3", "--axes", "gx,gy,gz,gdata"]
    rc, out, _ = run(capsys, *small, "--robustness", "2", "--json")
    moves = json.loads(out)["robustness"]
    assert rc == 0 and moves and all(m["winner"] in (0, 1) and m["regret_pct"] >= 0 for m in moves)
    rc, out, _ = run(capsys, *small, "--robustness", "2")
    assert rc == 0 and "robustness: each estimate moved by 20% each way, the top 2 re-simulated" in out
    assert_user_error(*run(capsys, *small, "--robustness", "1"), "--robustness")


def test_processes_give_the_same_answers():
    from twin.sensitivity import ranking_robustness

    machine = load_machine("frontier")
    fields = [GEMM_PEAK, "device.hbm_efficiency", "device.gemm_tile_m"]
    one = sensitivity(MODEL, PLAN, machine, 8, fields, jobs=1)
    assert sensitivity(MODEL, PLAN, machine, 8, fields, jobs=2) == one
    plans = [PLAN, parse_plan("gx=8,mbs=8,global_batch=8")]
    one = ranking_robustness(MODEL, plans, machine, 8, fields, jobs=1)
    assert ranking_robustness(MODEL, plans, machine, 8, fields, jobs=2) == one


@pytest.mark.parametrize("name", ["frontier", "perlmutter", "alps", "dgx-a100"])
def test_setting_every_number_to_its_own_value_changes_nothing(name):
    """Every sourced number of the shipped files can be addressed by --set, and only its provenance moves."""
    import tomllib

    from topologies.overrides import number_paths

    plain = load_machine(name)
    with open(plain.path, "rb") as f:
        paths = number_paths(tomllib.load(f))
    assert set(paths) == set(plain.sources)  # the names --set takes are the names the loader records
    for path in paths:
        same = load_machine(name, ((path, plain.sources[path].value),))
        assert (same.device, same.node, same.network, same.collectives) == \
            (plain.device, plain.node, plain.network, plain.collectives), path
        assert same.sources[path].value == plain.sources[path].value and "--set" in same.sources[path].estimate


def test_a_variant_the_plan_does_not_fit_is_a_skipped_side():
    from twin.build import resolve_step
    from twin.memory import RUNTIME_RESERVE_FRACTION

    plan = parse_plan("gx=2,gy=2,gz=2,mbs=2,ga=2,global_batch=8")  # a fixed micro-batch: it cannot shrink to fit
    _, memory = resolve_step(MODEL, plan, load_machine("frontier"), 8)
    hbm_gb = 1.1 * memory.total / (1 - RUNTIME_RESERVE_FRACTION) / 1e9  # fits, but not with 20% less
    machine = load_machine("frontier", (("device.hbm_gb", hbm_gb),))
    (hbm,) = sensitivity(MODEL, plan, machine, 8, ["device.hbm_gb"]).fields
    assert hbm.low_value is None and "does not fit" in hbm.skipped and hbm.high_step_s is not None
