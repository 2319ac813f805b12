"""twin search: the space, the lower bound, branch and bound, the cache, the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from helpers import SMALL_SPEC, check_search_bounds_and_ranking
from test_cli import assert_user_error, run
from topologies import load_machine
from twin.build import build_stages, build_step
from twin.errors import TwinError
from twin.memory import memory_per_gpu, usable_bytes
from twin.model import get_model, parse_model_spec
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan
from twin.search import rank
from twin.search.batch import sequences_for_tokens
from twin.search.bound import BoundModel
from twin.search.rank import search
from twin.search.space import SearchSpace, enumerate_space, factorisations
from twin.sim.engine import simulate

# A model whose every plan on 16 Frontier GCDs simulates in well under a second.
SEARCH_SPEC = "layers=4,hidden=1024,heads=16,seq=512,vocab=4096"
# The same in Llama's form: grouped-query attention (4 K/V heads: gx 8 and 16 no longer divide them), SwiGLU.
LLAMA_SEARCH_SPEC = "layers=4,hidden=1024,heads=16,kv_heads=4,ffn=2816,seq=512,vocab=4096,arch=llama"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EXATWIN_CACHE_DIR", str(tmp_path / "cache"))


def test_factorisations_are_every_ordered_product():
    found = factorisations(16, ("gx", "gy", "gz"))
    assert all(f["gx"] * f["gy"] * f["gz"] == 16 for f in found)
    assert len({tuple(sorted(f.items())) for f in found}) == len(found) == 15  # C(4 + 2, 2)


def test_every_candidate_is_valid_and_fits_and_the_rejected_say_why():
    machine = load_machine("frontier")
    model = get_model("GPT-20B")
    space = enumerate_space(model, 256, 8192, machine.device.hbm_bytes, SearchSpace(zero=(0, 1)))
    assert space.candidates
    for cand in space.candidates:
        validate_plan(cand.plan, model, 256)
        assert cand.memory_bytes == memory_per_gpu(model, cand.plan).total <= usable_bytes(machine.device.hbm_bytes)
        assert cand.plan.zero == 0 or cand.plan.gdata > 1
    assert space.rejected["does not fit in memory"] > 0
    plans = [c.plan.describe() for c in space.candidates]
    assert len(set(plans)) == len(plans)


def test_pipeline_plans_try_every_power_of_two_micro_batch_that_fits():
    machine = load_machine("frontier")
    space = enumerate_space(get_model("175B"), 128, 64, machine.device.hbm_bytes,
                            SearchSpace(axes=("gx", "gdata", "pp"), zero=(1,)))
    script = [c.plan for c in space.candidates if (c.plan.gx, c.plan.pp, c.plan.gdata) == (4, 16, 2)]
    assert sorted(p.mbs for p in script) == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("spec", [SEARCH_SPEC, LLAMA_SEARCH_SPEC])
def test_lower_bound_never_exceeds_the_simulated_step(spec):
    machine = load_machine("frontier")
    model = parse_model_spec(spec)
    bounds = BoundModel(machine, 16)
    space = enumerate_space(model, 16, 64, machine.device.hbm_bytes, SearchSpace(axes=("gx", "gy", "gz", "gdata", "pp")))
    assert len(space.candidates) > 20
    ratios = []
    for cand in space.candidates:
        built = build_step(model, cand.plan, machine, 16)
        bound = bounds.bound_s(built.schedule)
        step = simulate(built.schedule, machine).step_time_s
        assert bound <= step * (1 + 1e-9), cand.plan.describe()
        ratios.append(bound / step)
    assert max(ratios) > 0.95  # and it is not vacuous


def test_fsdp_resharding_is_searched_where_it_changes_the_plan():
    """--reshard 0,1: a FULL_SHARD variant of every plan with sharded weights and without full recompute, none
    elsewhere (the same step); each bounded from below, and branch and bound ranks them as simulating every plan."""
    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    space = SearchSpace(axes=("gx", "gz", "gdata"), recompute=("none", "full"), reshard=(False, True))
    found = enumerate_space(model, 16, 64, machine.device.hbm_bytes, space).candidates
    plain = enumerate_space(model, 16, 64, machine.device.hbm_bytes, replace(space, reshard=(False,))).candidates
    resharded = [c for c in found if c.plan.reshard]
    assert {c.plan for c in found if not c.plan.reshard} == {c.plan for c in plain}
    assert resharded and all(c.plan.gathered_shards > 1 and c.plan.recompute == "none" for c in resharded)
    expected = {replace(c.plan, reshard=True) for c in plain if c.plan.gz > 1 and c.plan.recompute == "none"}
    assert {replace(c.plan, mbs=0, ga=0) for c in resharded} == {replace(p, mbs=0, ga=0) for p in expected}
    bounds = BoundModel(machine, 16)
    for cand in resharded:
        built = build_step(model, cand.plan, machine, 16)
        assert bounds.bound_s(built.schedule) <= simulate(built.schedule, machine).step_time_s * (1 + 1e-9)
    pruned = search(model, 16, 64, machine, space, top=8, use_cache=False, jobs=1)
    every = search(model, 16, 64, machine, space, top=8, exhaustive=True, use_cache=False, jobs=1)
    assert [(r.plan, r.step_time_s) for r in pruned.ranked] == [(r.plan, r.step_time_s) for r in every.ranked]
    assert "reshard 0,1" in pruned.space
    tiny = 1e6  # nothing fits in 1 MB: each plan is rejected once, whatever its variants
    none_fit = enumerate_space(model, 16, 64, tiny, space).rejected["does not fit in memory"]
    assert none_fit == enumerate_space(model, 16, 64, tiny, replace(space, reshard=(False,))).rejected[
        "does not fit in memory"] > 0


def test_plan_words_given_with_every_candidate_are_held_by_every_plan_and_ranked_exactly():
    """--with: the words every candidate holds (torchtitan's FSDP2 in eager PyTorch here): each plan of the space is
    the plan without them but for those fields, bounded from below, and branch and bound ranks them as simulating
    every plan; the space says so, and its cache entry is not the plain search's."""
    machine = load_machine("frontier")
    model = parse_model_spec(LLAMA_SEARCH_SPEC)
    words = (("gradfp32", True), ("kernels", "eager"), ("norm", "eager"), ("fsdp2", True))
    space = SearchSpace(axes=("gz", "gdata"), recompute=("none", "op", "full"), reshard=(False, True), fixed=words)
    plain = replace(space, fixed=())
    found = enumerate_space(model, 16, 64, machine.device.hbm_bytes, space).candidates
    expected = enumerate_space(model, 16, 64, machine.device.hbm_bytes, plain).candidates
    assert found and all(all(getattr(c.plan, f) == v for f, v in words) for c in found)
    assert {replace(c.plan, **{f: getattr(ParallelPlan(), f) for f, _ in words}) for c in found} <= \
        {c.plan for c in expected}
    bounds = BoundModel(machine, 16)
    for cand in found[:6]:
        built = build_step(model, cand.plan, machine, 16)
        assert bounds.bound_s(built.schedule) <= simulate(built.schedule, machine).step_time_s * (1 + 1e-9)
    pruned = search(model, 16, 64, machine, space, top=6, jobs=1)
    every = search(model, 16, 64, machine, space, top=6, exhaustive=True, use_cache=False, jobs=1)
    assert [(r.plan, r.step_time_s) for r in pruned.ranked] == [(r.plan, r.step_time_s) for r in every.ranked]
    assert all("kernels=eager" in r.plan and "fsdp2=1" in r.plan for r in pruned.ranked)
    assert "with gradfp32=1,kernels=eager,norm=eager,fsdp2=1" in pruned.space
    assert not search(model, 16, 64, machine, plain, top=6, jobs=1).cached


def test_a_search_with_axonns_weights_cache_bounds_below_every_step_and_ranks_exactly():
    """--with axonn=1,cache=1: the screen leaves such plans alone (their cached layers' later passes cost less than
    any layer the screen builds) and the full bound, continued over layers past the cached ones, stays below every
    simulated step; the pruned search ranks as simulating every plan does."""
    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    space = SearchSpace(axes=("gx", "gz", "gdata"), fixed=(("axonn", True), ("cache", 1)))
    found = enumerate_space(model, 16, 64, machine.device.hbm_bytes, space)
    assert found.candidates and all(c.plan.cache == 1 and c.plan.gz > 1 for c in found.candidates)
    rank._init_worker(model, machine, 16)
    for cand in found.candidates:
        assert rank._bound_of(cand.plan) <= rank._simulate_plan(cand.plan).step_time_s * (1 + 1e-9), cand.plan
    pruned = search(model, 16, 64, machine, space, top=5, use_cache=False, jobs=1)
    every = search(model, 16, 64, machine, space, top=5, exhaustive=True, use_cache=False, jobs=1)
    assert [r.plan for r in pruned.ranked] == [r.plan for r in every.ranked]
    assert all("cache=1" in r.plan for r in pruned.ranked)


@pytest.mark.parametrize("words, mentions", [
    ("zero=1", ["--with: zero is what the search varies (--zero)"]),
    ("tp=2", ["--with: gx is what the search varies (--axes)"]),
    ("mbs=2", ["--with: mbs is what the search varies (--mbs)"]),
    ("kernels=slow", ["--with: kernels='slow' is unknown"]),
    ("gradfp32", ["--with: 'gradfp32' is not key=value"]),
    ("fp8pg=1", ["--with: fp8pg applies to FP8 linears, which the search varies (--fp8)"]),
    ("fp8recipe=delayed", ["--with: fp8recipe applies to FP8 linears"]),
])
def test_with_refuses_what_the_search_varies_and_bad_words(capsys, words, mentions):
    rc, out, err = run(capsys, "search", "--machine", "perlmutter", "--model-spec", SMALL_SPEC, "--gpus", "8",
                       "--jobs", "1", "--with", words)
    assert_user_error(rc, out, err, *mentions)


@pytest.mark.parametrize("spec", [SEARCH_SPEC, LLAMA_SEARCH_SPEC])
def test_branch_and_bound_ranks_exactly_as_simulating_every_plan(spec):
    machine = load_machine("frontier")
    model = parse_model_spec(spec)
    space = SearchSpace(axes=("gx", "gy", "gz", "gdata", "pp"), zero=(0, 1))
    pruned = search(model, 16, 64, machine, space, top=10, use_cache=False, jobs=1)
    screen = rank._WORKER["screen"]  # inline (jobs=1): the search's own ScreenModel
    assert 0 < len(screen._chains) < len(screen._work)  # some grids' collectives were never lowered
    every = search(model, 16, 64, machine, space, top=10, exhaustive=True, use_cache=False, jobs=1)
    screen = rank._WORKER["screen"]
    assert len(screen._chains) == len(screen._work)  # every plan bounded: every grid's C and S
    assert every.simulated == every.candidates > pruned.simulated
    assert every.bounded == every.candidates > pruned.bounded  # the screening bound ruled plans out on its own
    assert [r.plan for r in pruned.ranked] == [r.plan for r in every.ranked]
    assert [r.step_time_s for r in pruned.ranked] == [r.step_time_s for r in every.ranked]
    steps = [r.step_time_s for r in every.ranked]
    assert steps == sorted(steps) and len(steps) == 10


def test_parallel_workers_give_the_same_ranking():
    machine = load_machine("perlmutter")
    model = parse_model_spec(SMALL_SPEC)
    one = search(model, 16, 64, machine, top=5, use_cache=False, jobs=1)
    two = search(model, 16, 64, machine, top=5, use_cache=False, jobs=2)
    assert [(r.plan, r.step_time_s) for r in one.ranked] == [(r.plan, r.step_time_s) for r in two.ranked]


def test_a_repeated_search_comes_from_the_cache_and_a_changed_input_does_not():
    machine = load_machine("perlmutter")
    model = parse_model_spec(SMALL_SPEC)
    first = search(model, 8, 32, machine, top=3, jobs=1)
    again = search(model, 8, 32, machine, top=3, jobs=1)
    assert not first.cached and again.cached
    assert again.ranked == first.ranked
    other = search(replace(model, layers=4), 8, 32, machine, top=3, jobs=1)
    assert not other.cached


def test_no_valid_plan_is_a_one_line_error():
    machine = load_machine("frontier")
    with pytest.raises(TwinError, match="no valid plan.*GB more"):
        search(get_model("GPT-320B"), 8, 8192, machine, use_cache=False, jobs=1)


@pytest.mark.parametrize("text,seq,expected", [("16.8M", 2048, 8192), ("16777216", 2048, 8192), ("4M", 2048, 2048),
                                               ("1k", 128, 8)])
def test_batch_tokens(text, seq, expected):
    assert sequences_for_tokens(text, seq) == expected


@pytest.mark.parametrize("text", ["lots", "16.8X", "1000"])
def test_bad_batch_tokens(text):
    with pytest.raises(TwinError, match="--batch-tokens"):
        sequences_for_tokens(text, 2048)


def test_search_command_json_and_figure(capsys, tmp_path):
    figure = tmp_path / "landscape.png"
    rc, out, err = run(capsys, "search", "--machine", "perlmutter", "--model-spec", SMALL_SPEC, "--gpus", "8",
                       "--global-batch", "32", "--top", "3", "--jobs", "1", "--json", "--figure", str(figure))
    assert rc == 0, err
    doc = json.loads(out)
    assert len(doc["ranked"]) == 3 and figure.exists()
    assert {"plan", "step_time_s", "pflops_total", "memory_per_gpu_gb", "exposed_comm_s"} <= set(doc["ranked"][0])


@pytest.mark.parametrize("extra,mentions", [
    (["--axes", "gx,gq"], ["--axes", "gq"]),
    (["--zero", "5"], ["--zero"]),
    (["--recompute", "some"], ["--recompute"]),
    (["--reshard", "2"], ["--reshard '2' must be 0, 1 or 0,1"]),
    (["--reshard", ","], ["--reshard is empty"]),
    (["--min-tp", "8", "--max-tp", "4"], ["--max-tp"]),
    (["--global-batch", "3", "--axes", "gz,gdata"], ["no valid plan", "global batch not divisible by gdata*gz"]),
    (["--gpus", "7", "--axes", "gx,gy"], ["no valid plan", "heads not divisible by gx", "hidden not divisible by gy"]),
    (["--top", "0"], ["--top"]),
    (["--jobs", "-1"], ["--jobs: -1 is out of range"]),
    (["--batch-tokens", "many"], ["--batch-tokens"]),
])
def test_bad_searches_exit_2_with_one_line(capsys, extra, mentions):
    rc, out, err = run(capsys, "search", "--machine", "perlmutter", "--model-spec", SMALL_SPEC, "--gpus", "8",
                       "--jobs", "1", *extra)
    assert_user_error(rc, out, err, *mentions)


def test_continued_bound_stays_below_the_continued_step():
    """Bounds of many-micro-batch plans (pipelined or not) are continued from two short ones, like the steps."""
    from twin.micro_batches import evaluation_points

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    for text in ("gx=2,gz=2,gdata=4,mbs=1", "gz=16,mbs=1", "gx=2,gdata=2,pp=4,mbs=1"):
        plan = build_step(model, parse_plan(f"{text},global_batch=256"), machine, 16).plan
        assert evaluation_points(plan) is not None, text
        rank._init_worker(model, machine, 16)
        assert rank._bound_of(plan) <= rank._simulate_plan(plan).step_time_s * (1 + 1e-9), text

@pytest.mark.parametrize("text", ["gx=2,gz=2,gdata=4,mbs=1", "gx=4,gy=2,gdata=2,mbs=2", "gz=16,mbs=1",
                                  "gx=2,gdata=2,pp=4,mbs=1", "gy=2,gz=2,gdata=2,pp=2,mbs=2",
                                  "gx=2,gz=4,gdata=2,mbs=1,axonn=1,cache=3"])
def test_layer_continued_bound_terms_equal_the_full_models(text):
    """The bound's terms from 2- and 3-layer-per-stage models, continued, against bounding every layer."""
    from dataclasses import replace as dc_replace

    machine = load_machine("frontier")
    model = dc_replace(parse_model_spec(SEARCH_SPEC), layers=24)
    plan = build_step(model, parse_plan(f"{text},global_batch=64"), machine, 16).plan
    assert model.layers > 4 * plan.pp  # the continuation is taken
    rank._init_worker(model, machine, 16)
    bounds = rank._WORKER["bounds"]

    def terms(m):
        return bounds.terms_s(build_step(m, plan, machine, 16).schedule)

    continued = rank._layer_continued(model, plan, terms)
    full = terms(model)
    assert continued == pytest.approx(full, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("text", ["gdata=2,pp=8,mbs=1,global_batch=16", "gx=2,pp=8,mbs=2,global_batch=16",
                                  "gx=2,gdata=2,pp=4,zero=1,mbs=1,global_batch=8"])
def test_pipeline_bound_counts_the_bubble_and_stays_below_the_step(text):
    """With m = pp micro-batches the 1F1B bubble is almost half the step: the per-stage term must see it."""

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=16"))
    plan = build_step(model, parse_plan(text), machine, 16).plan
    assert plan.ga == plan.pp
    rank._init_worker(model, machine, 16)
    schedule = build_step(model, plan, machine, 16).schedule
    bounds = rank._WORKER["bounds"]
    assert len(bounds.pipeline_terms_s(schedule)) == plan.pp
    step = rank._simulate_plan(plan).step_time_s
    assert 0.7 * step < rank._bound_of(plan) <= step * (1 + 1e-9)
    per_program = max(t for p in schedule.programs for t in bounds.program_terms_s(schedule, p))
    assert per_program < 0.7 * step  # what the bound was without the pipeline term


@pytest.mark.parametrize("machine_name, text", [
    ("frontier", "gdata=4,pp=4,mbs=1,global_batch=16"),  # data-parallel all-reduces and the optimizer after it
    ("frontier", "gx=2,gdata=2,pp=4,zero=1,mbs=1,global_batch=8"),  # ZeRO-1: reduce-scatter, step, all-gather
    ("perlmutter", "gdata=4,pp=4,mbs=1,global_batch=16"),
])
def test_what_stage_0_does_after_its_last_backward_is_at_least_the_tail_the_bound_adds(machine_name, text):
    """The pipeline terms add stage 0's tail (twin.search.pipeline_bound.tail_s): in the simulation, stage 0's program
    ends at least that long after its last micro-batch op, and the bound stays below the step."""
    from twin.builders.program import COMPUTE_STREAM
    from twin.search.pipeline_bound import tail_s
    from twin.search.passes import micro_batch_of

    machine = load_machine(machine_name)
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    schedule = build_step(model, parse_plan(text), machine, 16).schedule
    bounds = BoundModel(machine, 16)
    stage0 = next(i for i, p in enumerate(schedule.programs) if 0 in p.ranks)
    program = schedule.programs[stage0]
    tail = tail_s(program, bounds.op_durations_s(schedule, program))
    run = simulate(schedule, machine)
    timeline = next(t for t in run.timelines if t.program == stage0)
    last = max(op.id for op in program.ops
               if op.stream == COMPUTE_STREAM and not op.is_comm and micro_batch_of(op) is not None)
    assert 0 < tail <= (timeline.end_s.max() - timeline.end_s[last]) * (1 + 1e-9)
    assert max(bounds.pipeline_terms_s(schedule)) <= run.step_time_s * (1 + 1e-9)


def test_a_pipeline_bound_from_three_stages_stays_below_the_one_from_all():
    """The search builds a long pipeline's first, second and last stages only; the middle ones count their
    compute (the same on every middle stage) but not their chains, so the bound is at most the one from all."""

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=16"))
    plan = build_step(model, parse_plan("gx=2,pp=8,mbs=1,global_batch=32"), machine, 16).plan
    rank._init_worker(model, machine, 16)
    bounds = rank._WORKER["bounds"]
    full = build_step(model, plan, machine, 16).schedule
    some = build_stages(model, plan, machine, 16, (0, 1, 7)).schedule
    assert len(some.programs) == 3
    with pytest.raises(ValueError, match="cover 6 of its 16 ranks: a partial schedule"):
        simulate(some, machine)
    partial, every = bounds.pipeline_terms_s(some), bounds.pipeline_terms_s(full)
    assert len(partial) == len(every) == 8
    assert all(p <= e * (1 + 1e-12) for p, e in zip(partial, every))
    assert partial[:2] == pytest.approx(every[:2], rel=1e-12)  # stages 0 and 1 are built in both
    assert max(partial) > 0.9 * max(every)


def test_pipeline_chains_see_the_collectives_a_stage_waits_on():
    """With few micro-batches and weights gathered across nodes, a stage's work is mostly waiting on gz's
    all-gathers: the pipeline term counts them, not only the compute, and stays below the simulated step."""

    machine = load_machine("perlmutter")  # 4 GPUs a node: gz=8 spans two
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    plan = build_step(model, parse_plan("gz=8,pp=2,mbs=1,global_batch=16"), machine, 16).plan
    rank._init_worker(model, machine, 16)
    bounds = rank._WORKER["bounds"]
    schedule = build_step(model, plan, machine, 16).schedule
    step = rank._simulate_plan(plan).step_time_s
    terms = bounds.pipeline_terms_s(schedule)
    compute_only = bounds.compute.duration_s
    stage0 = schedule.programs[0]
    compute = sum(compute_only(op.work) for op in stage0.ops if op.stream == "compute" and op.tag.micro_batch is not None)
    assert max(terms) <= step * (1 + 1e-9)
    assert max(terms) > 1.2 * compute * (plan.pp - 1 + plan.ga) / plan.ga


@pytest.mark.parametrize("text", ["gx=2,gz=2,gdata=4,mbs=1,global_batch=64", "gx=2,gy=2,gdata=2,pp=2,zero=1,mbs=2,global_batch=64",
                                  "gz=2,gdata=4,pp=2,zero=3,mbs=1,global_batch=64", "gx=4,gdata=2,pp=2,sp=1,mbs=1,global_batch=64",
                                  "gx=2,gdata=4,pp=2,vpp=2,mbs=1,global_batch=16", "gx=2,gz=2,pp=4,mbs=1,global_batch=16",
                                  "gx=2,gy=2,gz=2,gdata=2,recompute=selective,mbs=2,global_batch=64",
                                  "gy=4,gz=2,gdata=2,recompute=none,oar=0,mbs=1,global_batch=64",
                                  "gx=2,gy=2,gz=2,gdata=2,attention=unfused,recompute=selective,mbs=2,global_batch=64",
                                  "gx=4,gdata=2,pp=2,sp=1,attention=unfused,recompute=full,mbs=1,global_batch=64"])
def test_a_layer_on_the_grid_alone_bounds_every_layer_of_the_real_schedule(text):
    """The screening bound's W and C: gdata, ZeRO and the pipeline do not change a layer's ops, and the least of
    three grid layers is below every layer pass of the real schedule."""
    from twin.search.passes import least_per_layer_s, pass_chains_s, pass_compute_s
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    built = build_step(model, parse_plan(text), machine, 16)
    plan, schedule = built.plan, built.schedule
    bounds = BoundModel(machine, 16)
    w, c, _, busiest = ScreenModel(model, bounds).layer_s(plan)
    compute = bounds.compute.duration_s
    per_pass = {}
    for program in schedule.programs:
        durations = [0.0 if op.is_comm else compute(op.work) for op in program.ops]
        per_pass.update({(program.ranks[0], key): v for key, v in pass_compute_s(program, durations).items()})
    kinds = {key.phase for _, key in per_pass}
    rebuilds = plan.recompute == "full" or (plan.recompute, plan.attention) == ("selective", "unfused")
    assert kinds == ({"fwd", "rc", "bwd"} if rebuilds else {"fwd", "bwd"})
    assert len(per_pass) == len(schedule.programs) * plan.ga * model.layers // plan.pp * len(kinds)
    by_program = {rank: least_per_layer_s({k: v for (r, k), v in per_pass.items() if r == rank})
                  for rank in {r for r, _ in per_pass}}
    assert min(by_program.values()) == pytest.approx(w, rel=1e-12)
    rank0 = next(p for p in schedule.programs if p.ranks[0] == 0)
    chains = pass_chains_s(rank0, bounds.op_durations_s(schedule, rank0))
    least = {}
    for key, value in chains.items():
        least[key.phase] = min(value, least.get(key.phase, value))
    assert sum(least.values()) >= c * (1 - 1e-12)  # every real pass is at least its kind's least grid pass
    assert c >= w * (1 - 1e-12) or plan.zero == 3
    if plan.zero != 3:  # K: rank 0's busiest stream carries at least K per layer and micro-batch
        durations = bounds.op_durations_s(schedule, rank0)
        busy = {}
        for op in rank0.ops:
            if op.work.comm:
                busy[op.stream] = busy.get(op.stream, 0.0) + durations[op.id]
        per_rank = model.layers // (plan.pp * plan.vpp) * plan.vpp
        assert max(busy.values(), default=0.0) >= plan.ga * per_rank * busiest * (1 - 1e-12)


@pytest.mark.parametrize("text", ["gx=2,gz=2,gdata=4,attention=unfused,recompute=selective,mbs=1,global_batch=64",
                                  "gx=4,gy=2,gdata=2,oar=0,attention=unfused,recompute=selective,mbs=2,global_batch=64",
                                  "gx=2,gdata=4,pp=2,attention=unfused,recompute=none,mbs=1,global_batch=64"])
def test_screening_bound_holds_with_unfused_attention(text):
    """Selective recompute puts a layer's core-attention recompute pass inside its backward pass: the passes'
    chains still add up to no more than the simulated step."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    plan = build_step(model, parse_plan(text), machine, 16).plan
    step = simulate(build_step(model, plan, machine, 16).schedule, machine).step_time_s
    assert 0 < ScreenModel(model, BoundModel(machine, 16)).bound_s(plan) <= step * (1 + 1e-9)


def _one_layer_w_is_three_layers_w(model, machine, gpus: int, axes: tuple[str, ...]) -> int:
    """W from one layer against the least of three, on every grid of a search space: equal to the last bit."""
    from twin.search.screen import ScreenModel, grid_plan

    screen = ScreenModel(model, BoundModel(machine, gpus))
    found = enumerate_space(model, gpus, 64 if gpus <= 64 else 8192, machine.device.hbm_bytes, SearchSpace(axes=axes))
    grids = list(dict.fromkeys(grid_plan(c.plan) for c in found.candidates))
    for grid in grids:
        three = screen.least_layer_work_s(screen._schedule(grid, 3).programs)
        assert screen.work_s(grid) == three, grid.describe()
    return len(grids)


def test_a_layers_compute_does_not_depend_on_where_it_sits():
    """The screen's W comes from one layer: the least of three layers (first, middle, last) is the same on every
    grid of a small space over every axis, cp included."""
    from twin.search.space import AXES

    model = parse_model_spec(SEARCH_SPEC)
    assert _one_layer_w_is_three_layers_w(model, load_machine("frontier"), 16, tuple(AXES)) > 20


@pytest.mark.slow
@pytest.mark.parametrize("machine, model, gpus, every", [("frontier", "175B", 1024, True),
                                                         ("frontier", "GPT-320B", 32768, False),
                                                         ("perlmutter", "GPT-5B", 512, True)])
def test_a_layers_compute_does_not_depend_on_where_it_sits_at_scale(machine, model, gpus, every):
    """The same on every grid of three searches: 175B on 1,024 GCDs and GPT-5B on 512 Perlmutter GPUs over every
    axis (cp included), GPT-320B on 32,768 GCDs over the default axes (about 4,000 grids each)."""
    from twin.search.space import AXES, DEFAULT_AXES

    axes = tuple(AXES) if every else DEFAULT_AXES
    assert _one_layer_w_is_three_layers_w(get_model(model), load_machine(machine), gpus, axes) > 1000


def test_the_busiest_stream_sees_weight_gathers_the_chain_leaves_out():
    """With weights sharded over Z across nodes, rank 0's Z stream (prefetched weight all-gathers and gradient
    reduce-scatters, which no pass's chain waits on) outlasts the layer's chain: K > C, and the screening bound
    that counts it still holds against the simulated step."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec("layers=4,hidden=2048,heads=16,seq=128,vocab=4096")  # wide weights, short sequences
    plan = build_step(model, parse_plan("gz=16,mbs=1,global_batch=64"), machine, 16).plan
    screen = ScreenModel(model, BoundModel(machine, 16))
    w, c, _, busiest = screen.layer_s(plan)
    assert busiest > c >= w
    step = simulate(build_step(model, plan, machine, 16).schedule, machine).step_time_s
    per_rank = model.layers // plan.pp
    assert plan.ga * per_rank * busiest <= screen.bound_s(plan) <= step * (1 + 1e-9)


def test_the_pipeline_term_counts_stage_zero_at_rank_zeros_chains():
    """Stage 0 holds rank 0, whose passes take at least C (network links included), more than S where the
    tensor-parallel collectives cross switches on their direct links (minimal routing: adaptive routing pools a
    switch's links): the pipeline term counts its forward and backward at C, above the all-S chain and still
    below the step."""
    from dataclasses import replace

    from twin.search.screen import ScreenModel

    machine = load_machine("perlmutter")
    machine = replace(machine, network=replace(machine.network, routing="minimal"))
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    plan = build_step(model, parse_plan("gx=8,gy=16,pp=2,mbs=1,global_batch=4"), machine, 256).plan
    screen = ScreenModel(model, BoundModel(machine, 256))
    w, c, s, _ = screen.layer_s(plan)
    per_rank = model.layers // plan.pp
    assert c > s > w
    all_s = (plan.pp - 1 + plan.ga) * per_rank * s
    step = simulate(build_step(model, plan, machine, 256).schedule, machine).step_time_s
    assert all_s < screen.bound_s(plan) <= step * (1 + 1e-9)


def test_the_stage_chain_shares_the_nodes_links_with_its_axis():
    """S counts a collective's instances on its node together on the node's own links (the NICs the Y
    all-reduces of gx=8, gy=2 share across two nodes), as the full bound does: here it reaches C."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    plan = build_step(model, parse_plan("gx=8,gy=2,pp=2,mbs=1,global_batch=4"), machine, 32).plan
    w, c, s, _ = ScreenModel(model, BoundModel(machine, 32)).layer_s(plan)
    assert s == pytest.approx(c, rel=1e-12) and s > 1.3 * w


def test_the_layer_chain_sees_blocking_collectives():
    """C exceeds the compute W when a layer waits on tensor-parallel collectives (gx's all-reduces)."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    plan = build_step(model, parse_plan("gx=8,gdata=2,mbs=1,global_batch=64"), machine, 16).plan
    w, c, *_ = ScreenModel(model, BoundModel(machine, 16)).layer_s(plan)
    assert c > 1.05 * w


@pytest.mark.parametrize("text, gpus", [("gx=8,pp=4,mbs=1,global_batch=16", 32),
                                        ("gx=8,gz=2,pp=2,mbs=1,global_batch=16", 32),  # z across two nodes
                                        ("gx=2,gy=2,gz=2,gdata=2,pp=2,mbs=2,global_batch=32", 32)])
def test_every_pipeline_stage_on_whole_nodes_passes_at_least_the_screens_stage_chain(text, gpus):
    """S, the grid's layer chain with collectives on the nodes' own links alone, is below every stage's least
    layer passes under the full bound's durations (contention and network links included), wherever the stage
    sits: what lets the screen's pipeline term count it for every stage."""
    from twin.search.passes import pass_chains_s
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    built = build_step(model, parse_plan(text), machine, gpus)
    bounds = BoundModel(machine, gpus)
    w, c, s, _ = ScreenModel(model, bounds).layer_s(built.plan)
    assert s > w  # the tensor-parallel collectives on the chain count
    for program in built.schedule.programs:
        chains = pass_chains_s(program, bounds.op_durations_s(built.schedule, program))
        least = {}
        for key, value in chains.items():
            least[key.phase] = min(value, least.get(key.phase, value))
        assert sum(least.values()) >= s * (1 - 1e-12), program.ranks[0]


def test_screening_bound_never_exceeds_the_simulated_step():
    """Every plan of a small space, pipelined or not: the cheap bound holds, and is tight where compute dominates."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    screen = ScreenModel(model, BoundModel(machine, 16))
    space = enumerate_space(model, 16, 64, machine.device.hbm_bytes, SearchSpace(axes=("gx", "gy", "gz", "gdata", "pp")))
    ratios = []
    for cand in space.candidates:
        step = simulate(build_step(model, cand.plan, machine, 16).schedule, machine).step_time_s
        bound = screen.bound_s(cand.plan)
        assert 0 < bound <= step * (1 + 1e-9), cand.plan.describe()
        ratios.append(bound / step)
    assert max(ratios) > 0.6


def _pipeline(machine_name: str, text: str, gpus: int):
    machine = load_machine(machine_name)
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    return machine, build_step(model, parse_plan(text), machine, gpus).schedule


@pytest.mark.parametrize("machine_name, text, gpus, shared", [
    ("frontier", "gdata=8,pp=8,mbs=1,global_batch=64", 64, True),  # a node per stage: eight pipelines, four NICs
    ("perlmutter", "gx=2,gdata=4,pp=4,mbs=1,global_batch=32", 32, False),  # a NIC per GPU
])
def test_a_pipeline_transfer_in_the_bound_runs_at_its_familys_pace(machine_name, text, gpus, shared):
    """With one program per stage, every pipeline's transfer at one position is one family in the simulator,
    whose load is every instance's route: the bound times each transfer exactly at that family's pace alone
    (never below the one transfer alone), and the step stays above the bound."""
    from topologies.fabric import Fabric
    from topologies.placement import place_ranks
    from twin.ir import P2P
    from twin.sim.collectives import CollectiveModel
    from twin.sim.flowtypes import FlowTypes
    from twin.sim.symmetry import classify

    machine, schedule = _pipeline(machine_name, text, gpus)
    bounds = BoundModel(machine, gpus)
    sym = classify(schedule, full=False)
    types = FlowTypes.build(schedule, sym, CollectiveModel(Fabric(machine, gpus)), place_ranks(gpus, machine))
    checked = 0
    for cls, rank_ in enumerate(sym.representatives):
        program = schedule.programs[sym.programs[cls]]
        for op in program.ops:
            if not isinstance(op.work, P2P):
                continue
            latency, phases = types.cost(types.per_op[cls][op.id].type_id)
            family = latency + sum(op.work.nbytes * s for _, _, s in phases)
            assert bounds._op_s(schedule, rank_, op.work) == pytest.approx(family, rel=1e-9)
            checked += 1
    assert checked
    members = schedule.group("pp").instances[0]
    alone = bounds._transfer_s(members[0], members[1], 1 << 20)
    hop = bounds._hop_s(schedule, bounds._layout(schedule, "pp"), members, 0, 1, 1 << 20)
    assert hop > 1.5 * alone if shared else hop == pytest.approx(alone, rel=1e-12)
    assert bounds.bound_s(schedule) <= simulate(schedule, machine).step_time_s * (1 + 1e-9)


def test_the_pipeline_terms_add_each_boundarys_transfers_to_the_chain_before_a_stage(monkeypatch):
    """Stage k's term counts the boundaries before it: the activation on and the gradient back across each
    (BoundModel.stage_hops_s), on top of the stages' own forward and backward; the bound stays below the step."""
    machine, schedule = _pipeline("frontier", "gdata=8,pp=8,mbs=1,global_batch=64", 64)
    bounds = BoundModel(machine, 64)
    hops = bounds.stage_hops_s(schedule, 8)
    assert all(h > 0 for h in hops[:-1]) and hops[-1] == 0
    terms = bounds.pipeline_terms_s(schedule)
    monkeypatch.setattr(BoundModel, "stage_hops_s", lambda self, s, stages: [0.0] * stages)
    without = bounds.pipeline_terms_s(schedule)
    for k in range(8):
        assert terms[k] - without[k] == pytest.approx(sum(hops[:k]), rel=1e-9)
    assert max(terms) <= simulate(schedule, machine).step_time_s * (1 + 1e-9)


def test_a_stages_own_term_counts_the_receives_between_its_runs_but_not_the_first():
    """On a 1F1B stage every receive but the first forward's is issued after one micro-batch run and waited for
    by the next: twin.search.pipeline_bound.received_s counts each of those once, and leaves the first (the chain
    of earlier stages counts it) out."""
    from twin.ir import P2P
    from twin.search.pipeline_bound import received_s

    machine, schedule = _pipeline("frontier", "gdata=8,pp=8,mbs=1,global_batch=64", 64)
    bounds = BoundModel(machine, 64)
    program = next(p for p in schedule.programs if 8 in p.ranks)  # stage 1: receives from both sides
    durations = bounds.op_durations_s(schedule, program)
    receives = [op for op in program.ops if isinstance(op.work, P2P) and op.work.kind == "recv"]
    assert len(receives) == 16  # 8 micro-batches' activations and gradients
    assert received_s(program, durations) == pytest.approx(sum(durations[op.id] for op in receives[1:]), rel=1e-12)


@pytest.mark.parametrize("text", ["gx=2,gdata=2,pp=4,pemb=1,ploss=1,mbs=1", "gdata=2,pp=8,pemb=1,ploss=1,mbs=1",
                                  "gx=2,gdata=2,pp=4,vpp=2,pemb=1,ploss=1,mbs=1"])
def test_bounds_hold_where_the_embedding_and_the_loss_count_as_layers(text):
    """pemb/ploss: the end stages hold fewer layers. The layer-continued bound terms equal the full model's, and
    the full bound and the screening bound stay below the simulated step."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=30"))  # 30 + 2 slots: 8 or 4 a chunk
    gpus = 16
    plan = build_step(model, parse_plan(f"{text},global_batch=32"), machine, gpus).plan
    rank._init_worker(model, machine, gpus)
    bounds = rank._WORKER["bounds"]

    def terms(m):
        return bounds.terms_s(build_step(m, plan, machine, gpus).schedule)

    assert rank._layer_continued(model, plan, terms) == pytest.approx(terms(model), rel=1e-9, abs=1e-12)
    step = rank._simulate_plan(plan).step_time_s
    assert rank._bound_of(plan) <= step * (1 + 1e-9)
    assert 0 < ScreenModel(model, BoundModel(machine, gpus)).bound_s(plan) <= step * (1 + 1e-9)


def test_search_space_takes_the_end_slot_split_only_where_the_even_one_does_not_divide():
    """126 layers: pp=16 plans appear with pemb=1, ploss=1; pp=2 (even) plans keep the even split. 127 layers: every
    pipeline counts the loss alone (128 slots)."""
    model = replace(parse_model_spec(SEARCH_SPEC), layers=126)
    space = enumerate_space(model, 32, 64, 1e15, SearchSpace(axes=("gdata", "pp")))
    by_pp = {c.plan.pp: c.plan for c in space.candidates}
    assert all(by_pp[pp].pemb and by_pp[pp].ploss for pp in (4, 8, 16, 32))  # 128 slots
    assert not (by_pp[1].pemb or by_pp[2].pemb or by_pp[2].ploss)  # 63 layers a stage
    odd = enumerate_space(replace(model, layers=127), 32, 64, 1e15, SearchSpace(axes=("gdata", "pp")))
    by_pp = {c.plan.pp: c.plan for c in odd.candidates}
    assert all(by_pp[pp].ploss and not by_pp[pp].pemb for pp in (2, 4, 8, 16, 32))  # 128 slots with the loss's
    assert 1 in by_pp and not by_pp[1].ploss


MEGATRON_OPTIONS = SearchSpace(axes=("gx", "gdata", "pp"), zero=(0, 1), vpp=(1, 2), sp=(False, True),
                               tpo=(False, True), odp=(False, True))


def test_megatron_schedule_options_are_searched_only_where_they_apply():
    """--vpp/--sp/--tpo/--odp: each option appears where it changes the step, and every plan appears once."""
    model = parse_model_spec(SEARCH_SPEC)
    plans = [c.plan for c in enumerate_space(model, 8, 32, 1e15, MEGATRON_OPTIONS).candidates]
    assert len({p.describe() for p in plans}) == len(plans)
    assert all(p.pp > 1 for p in plans if p.vpp > 1) and any(p.vpp == 2 for p in plans)
    assert all(p.gx > 1 for p in plans if p.sp) and all(p.sp for p in plans if p.tpo) and any(p.tpo for p in plans)
    assert all(p.gdata > 1 for p in plans if p.odp) and any(p.odp and p.zero == 1 for p in plans)
    plain = enumerate_space(model, 8, 32, 1e15, SearchSpace(axes=("gx", "gdata", "pp"), zero=(0, 1))).candidates
    assert {c.plan for c in plain} <= set(plans)
    assert "vpp 1,2; sp 0,1; tpo 0,1; odp 0,1" in MEGATRON_OPTIONS.describe()


def test_bounds_hold_and_the_ranking_is_exact_with_megatron_schedule_options():
    """Every plan of a space with interleaving, sequence parallelism and both overlaps: the screening bound and the
    full bound stay below its simulated step, and branch and bound ranks as simulating every plan does."""
    model = parse_model_spec(SEARCH_SPEC)
    _, pruned, every = check_search_bounds_and_ranking(model, load_machine("frontier"), 8, 32, MEGATRON_OPTIONS, top=8)
    assert every.simulated > pruned.simulated


def test_interleaving_that_no_micro_batch_size_allows_falls_back_to_one_chunk():
    """--vpp 2 alone: where the sequences per rank cannot make whole rounds of the stages (2 sequences on 4 stages),
    the plan is searched uninterleaved, not rejected as if it did not fit; with 4 sequences it is interleaved."""
    model = parse_model_spec(SEARCH_SPEC.replace("layers=4", "layers=8"))
    space = SearchSpace(axes=("gdata", "pp"), vpp=(2,))
    for batch, chunks in ((4, 1), (8, 2)):  # pp=4 takes gdata=2: 2 or 4 sequences per rank
        found = enumerate_space(model, 8, batch, 1e15, space)
        assert {c.plan.vpp for c in found.candidates if c.plan.pp == 4} == {chunks}, batch
        assert not found.rejected["does not fit in memory"]


RANK_ORDERS = SearchSpace(axes=("gx", "gdata", "pp"), zero=(0, 1), dpouter=(False, True))


def test_rank_order_is_searched_where_there_are_stages_and_replicas():
    """--dpouter 0,1: the order appears only where pp > 1 and dp > 1, each plan once, the default plans kept."""
    model = parse_model_spec(SEARCH_SPEC)
    plans = [c.plan for c in enumerate_space(model, 16, 32, 1e15, RANK_ORDERS).candidates]
    assert len({p.describe() for p in plans}) == len(plans)
    assert all(p.pp > 1 and p.gdata > 1 for p in plans if p.dpouter) and any(p.dpouter for p in plans)
    plain = enumerate_space(model, 16, 32, 1e15, replace(RANK_ORDERS, dpouter=(False,))).candidates
    assert {c.plan for c in plain} <= set(plans)
    assert "dpouter 0,1" in RANK_ORDERS.describe()


def test_bounds_hold_and_the_ranking_is_exact_over_rank_orders():
    """Two Frontier nodes: with the replicas outermost a pipeline's stages share a node and its replicas cross the
    network (the other way round by default), so the bounds' links and instances come from the plan's placement.
    Every plan's screening and full bound stay below its simulated step, the order changes some steps, and branch
    and bound ranks as simulating every plan does."""
    from twin.search.screen import ScreenModel

    machine = load_machine("frontier")
    model = parse_model_spec(SEARCH_SPEC)
    screen = ScreenModel(model, BoundModel(machine, 16))
    rank._init_worker(model, machine, 16)
    steps = {}
    for cand in enumerate_space(model, 16, 32, machine.device.hbm_bytes, RANK_ORDERS).candidates:
        step = steps[cand.plan] = rank._simulate_plan(cand.plan).step_time_s
        assert 0 < screen.bound_s(cand.plan) <= step * (1 + 1e-9), cand.plan.describe()
        assert rank._bound_of(cand.plan) <= step * (1 + 1e-9), cand.plan.describe()
    moved = [p for p in steps if p.dpouter and abs(steps[p] / steps[replace(p, dpouter=False)] - 1) > 1e-3]
    assert moved, "no plan's step depends on the rank order"
    pruned = search(model, 16, 32, machine, RANK_ORDERS, top=8, use_cache=False, jobs=1)
    every = search(model, 16, 32, machine, RANK_ORDERS, top=8, exhaustive=True, use_cache=False, jobs=1)
    assert every.simulated > pruned.simulated
    assert [(r.plan, r.step_time_s) for r in pruned.ranked] == [(r.plan, r.step_time_s) for r in every.ranked]
