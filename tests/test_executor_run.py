"""The executor for real: gloo on CPU, 2-8 processes started by torchrun, each run under a hard time limit.

Every launch has a wall-clock limit (run_local kills its torchrun process
group when it passes), so no test can hang. The slow ones (8 ranks, timeouts,
calibration, compare) run in CI with `make test-all`.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path
from dataclasses import fields, replace

import pytest

pytest.importorskip("torch")

from topologies import load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.cli import main  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.ir import Attention, Collective  # noqa: E402
from twin.ir_io import load_schedule, save_schedule  # noqa: E402
from twin.model import ModelSpec, get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.report import Summary  # noqa: E402

from executor.launch import WorkerOptions, buffer_bytes, run_local  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from collective_split import PARTS, main as collective_split  # noqa: E402
from wake_ups import wake_ups  # noqa: E402

LIMIT_S = 120  # per launch
REPO = Path(__file__).resolve().parents[1]


def export(tmp_path, plan: str, gpus: int, batch: int = 8, name: str = "step.json", model: ModelSpec | None = None):
    model = model or get_model("tiny")
    built = build_step(model, parse_plan(plan, parse_plan(f"global_batch={batch}")), load_machine("frontier"), gpus)
    path = tmp_path / name
    save_schedule(built.schedule, path)
    return built.schedule, str(path)


def numerics(schedule, path, out) -> dict:
    run_local(schedule, path, schedule.world_size, str(out), WorkerOptions(check_numerics=True), LIMIT_S)
    return json.loads((out / "numerics.json").read_text())


def with_group_moved(schedule, layer: int, block: str, role: str, axis: str, tmp_path):
    """The schedule with every op of `layer`'s linear `block` in `role` put on group `axis` (a wrong group), saved:
    (schedule, path)."""
    def moved(op):
        if (op.tag.layer, op.tag.block, op.tag.role) != (layer, block, role):
            return op
        return replace(op, stream=f"comm:{axis}", work=replace(op.work, group=axis))

    bad = replace(schedule, programs=tuple(replace(p, ops=tuple(moved(op) for op in p.ops)) for p in schedule.programs))
    path = tmp_path / "bad.json"
    save_schedule(bad, path)
    return bad, str(path)


# ---- measuring ------------------------------------------------------------------------------


def test_run_measures_a_step_and_the_trace_loads_back(tmp_path, capsys):
    _, path = export(tmp_path, "gx=2", 2)
    trace = tmp_path / "measured.trace.json"
    # a machine whose peak any run beats: the summary says its percentages mean little
    slow = tmp_path / "slow.toml"
    slow.write_text(re.sub(r"(peak_bf16_tflop_per_s|empirical_gemm_bf16_tflop_per_s) = \{ value = [0-9.e-]+",
                           r"\1 = { value = 1e-9", (REPO / "topologies" / "local.toml").read_text()))
    rc = main(["run", path, "--nproc", "2", "--steps", "2", "--warmup", "1", "--out", str(tmp_path / "run"),
               "--trace", str(trace), "--wall-timeout", str(LIMIT_S), "--profile-steps", "1", "--machine", str(slow)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "float32" in out and "gloo" in out and "step time" in out
    assert "note: this run beat machine" in out
    assert re.search(r"set-up before the first step: [0-9.]+ s \(the slowest rank; rank 0's buffers [0-9.]+ GB\)", out)
    schedule = load_schedule(path)
    doc = json.loads(trace.read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * len(schedule.programs[0].ops)
    assert all(e["dur"] >= 0 for e in spans)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary) == {f.name for f in fields(Summary)}
    assert summary["step_time_s"] > 0 and summary["gpus"] == 2
    launch = json.loads((tmp_path / "run" / "launch.json").read_text())
    assert launch["returncode"] == 0
    # what the launcher estimates a rank allocates is what the ranks allocated, plus the recorded attention forward
    allocated = max(json.loads((tmp_path / "run" / f"rank{r}.json").read_text())["buffer_bytes"] for r in range(2))
    recorded = {(w.batch, w.heads, w.seq, w.head_dim) for w in (o.work for o in schedule.programs[0].ops)
                if isinstance(w, Attention) and w.backward}
    assert allocated > 0 and buffer_bytes(schedule) == allocated + 4 * 4 * sum(math.prod(s) for s in recorded)
    # --profile-steps: one more step per rank under torch.profiler, marked for twin compare-trace, which on a
    # CPU run finds no GPU kernels to compare and says so
    profile = tmp_path / "run" / "profile-rank0.json"
    events = json.loads(profile.read_text())["traceEvents"]
    assert [e["name"] for e in events if str(e.get("name")).startswith("ProfilerStep#")] == ["ProfilerStep#1"]
    rc = main(["compare-trace", str(profile), "--schedule", path, "--machine", "local"])
    err = capsys.readouterr().err
    assert rc == 2 and "no GPU kernels" in err and len(err.strip().splitlines()) == 1


# ---- numerics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", ["gx=2,gy=2", "gx=2,gy=2,oar=0,ors=0,oag=0,recompute=none"])
def test_numerics_pass_for_4d_layers_transposed_and_not(tmp_path, plan):
    schedule, path = export(tmp_path, plan, 4)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]
    assert result["max_rel_err"] < result["bound"] == 1e-4
    assert result["linears_per_rank"] == [9, 9, 9, 9]  # 2 layers x 4 linears + the LM head


def test_numerics_pass_with_sequence_parallelism(tmp_path):
    schedule, path = export(tmp_path, "gx=2,sp=1", 2)
    assert any(op.tag.role == "ag_in_x" for op in schedule.programs[0].ops)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]
    assert result["linears_per_rank"] == [9, 9]


@pytest.mark.parametrize("plan", ["gx=2,mbs=1,recompute=full,rcl=1", "gz=2,mbs=1,recompute=full,rcl=1,reshard=1"])
def test_numerics_pass_with_only_the_first_layer_recomputed(tmp_path, plan):
    """rcl=1: layer 0 reruns its forward before its backward, layer 1 keeps its activations (with reshard, weights
    sharded over z: gathers its weights again for its backward)."""
    schedule, path = export(tmp_path, plan, 2)
    assert {op.tag.layer for op in schedule.programs[0].ops if op.tag.phase == "rc" and op.tag.layer is not None} \
        == {0}
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_numerics_pass_with_eager_kernels(tmp_path):
    """kernels=eager: a Llama layer's element-wise work op by op (the rotary embedding's casts and complex
    multiply, SwiGLU's silu and multiply, grouped-query attention's k and v copied out to every head) runs as
    scratch kernels between the checked linears."""
    llama = ModelSpec("tiny-llama", layers=2, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024, ffn=512,
                      arch="llama", dropout=False)
    schedule, path = export(tmp_path, "gz=2,mbs=1,recompute=full,kernels=eager", 2, model=llama)
    roles = {(op.tag.block, op.tag.role) for op in schedule.programs[0].ops if op.tag.layer == 0}
    assert {("rope_q", "up"), ("swiglu", "silu"), ("attn", "k_repeat"), ("attn", "v_repeat_bwd")} <= roles
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


@pytest.mark.parametrize("reshard", [0, 1])
def test_numerics_pass_with_per_operator_checkpointing(tmp_path, reshard):
    """recompute=op on a Llama block with its weights sharded over z: the rerun's partial GEMMs (k's columns of
    QKV, the up half of the gate and up) run as scratch kernels and the attention output's GEMM is checked, on the
    weights the rerun gathers back (reshard) or the forward's (without it); the backward gathers nothing again."""
    llama = ModelSpec("tiny-llama", layers=2, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024, ffn=512,
                      arch="llama", dropout=False)
    schedule, path = export(tmp_path, f"gz=2,mbs=1,reshard={reshard},recompute=op", 2, model=llama)
    roles = {(op.tag.phase, op.tag.block, op.tag.role) for op in schedule.programs[0].ops if op.tag.layer == 0}
    assert {("rc", "qkv", "gemm_part"), ("rc", "attn_out", "gemm")} <= roles
    assert (("rc", "mlp_down", "ag_z") in roles) == bool(reshard)
    assert not any(phase == "bwd" and role == "ag_z" for phase, _, role in roles)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_numerics_pass_with_gradients_reduced_in_fp32(tmp_path):
    """gradfp32=1: the weight gradients' reduce-scatters over z are fp32 collectives; the run's linears still check."""
    schedule, path = export(tmp_path, "gz=2,mbs=1,gradfp32=1", 2)
    assert {op.work.dtype for op in schedule.programs[0].ops if op.tag.role == "rs_z"} == {"fp32"}
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_numerics_pass_with_axonns_whole_lm_head(tmp_path):
    """axonn=1: the LM head, the word table Megatron-AxoNN does not shard over Z, is neither gathered nor scattered;
    its gradient is whole once summed over Z (the step's all-reduce over Z of the replicated gradients runs on
    scratch buffers); the layers' linears still gather and scatter theirs."""
    schedule, path = export(tmp_path, "gz=2,mbs=1,axonn=1", 2)
    roles = {(op.tag.block, op.tag.role) for op in schedule.programs[0].ops}
    assert ("lm_head", "gemm") in roles and ("lm_head", "ag_z") not in roles and ("qkv", "ag_z") in roles
    assert ("main_grad", "ar_z") in roles
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_numerics_pass_with_axonns_weights_cache(tmp_path):
    """axonn=1 with cache=1: the first layer's recompute and second micro-batch gather nothing and multiply by the
    weights its first forward gathered; every linear still checks."""
    schedule, path = export(tmp_path, "gz=2,mbs=1,ga=2,axonn=1,cache=1", 2, batch=4)
    gathered = {(op.tag.micro_batch, op.tag.phase, op.tag.layer) for op in schedule.programs[0].ops
                if op.tag.role == "ag_z"}
    assert (0, "fwd", 0) in gathered and (0, "rc", 1) in gathered
    assert not {(0, "rc", 0), (1, "fwd", 0), (1, "rc", 0)} & gathered
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_unfused_attention_with_selective_recompute_runs_and_its_numerics_pass(tmp_path):
    """The unfused core attention's batched GEMMs and element-wise kernels run as scratch kernels between the
    checked linears."""
    schedule, path = export(tmp_path, "gx=2,attention=unfused,recompute=selective", 2)
    assert any((op.tag.phase, op.tag.layer, op.tag.block, op.tag.role) == ("rc", 0, "attn", "scores")
               for op in schedule.programs[0].ops)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]
    assert result["linears_per_rank"] == [9, 9]


@pytest.mark.slow
@pytest.mark.parametrize("plan, gpus", [
    ("gx=2,gz=2,sp=1,mbs=1", 4),  # sequence parallelism with z-sharded weights and two micro-batches
    ("tp=2,pp=2,sp=1,mbs=1", 4),  # sequence parallelism across pipeline stages
    ("gx=2,gy=2,gz=2", 8),  # every tensor axis > 1
    ("gz=2,gdata=2,zero=3", 4),  # ZeRO-3: weights sharded over z+data
    ("gz=2,gdata=2,reshard=1,recompute=none", 4),  # FSDP's FULL_SHARD: weights gathered again for the backward
    ("gx=2,gdata=2,mbs=2", 4),  # gradient accumulation + data-parallel all-reduce
    ("tp=2,pp=2,mbs=1", 4),  # pipeline: layers on two stages, p2p transfers
])
def test_numerics_pass_for_more_plans(tmp_path, plan, gpus):
    schedule, path = export(tmp_path, plan, gpus)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_replicas_outermost_each_process_runs_the_rank_placed_on_its_gpu(tmp_path):
    """dpouter=1 (tp-cp-pp-dp): the process torchrun starts on GPU slot g runs the rank twin.mesh places there, so
    the ranks and their groups are the schedule's wherever the processes sit; the numerics pass and each rank's
    record names the slot it ran on."""
    from twin.mesh import rank_gpus

    schedule, path = export(tmp_path, "dp=2,pp=2,dpouter=1,mbs=1", 4)
    placed = rank_gpus(schedule.info.plan)
    assert placed != list(range(4))  # ranks 1 and 2 swap places
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]
    run_local(schedule, path, 4, str(tmp_path / "run"), WorkerOptions(steps=1, warmup=0), LIMIT_S)
    slots = {r: json.loads((tmp_path / "run" / f"rank{r}.json").read_text())["slot"] for r in range(4)}
    assert slots == dict(enumerate(placed))


# The tiny model in Llama's form: grouped-query attention (2 K/V heads for 4), a SwiGLU MLP, no biases.
TINY_LLAMA = ModelSpec(name="tiny-llama", layers=2, hidden=256, heads=4, kv_heads=2, ffn=384, seq=128, vocab=1024,
                       dropout=False, arch="llama")


@pytest.mark.parametrize("plan", ["gx=2,gz=2", "gx=2,gy=2,mbs=2"])
def test_numerics_pass_for_a_llama_model(tmp_path, plan):
    """The QKV linear's narrower K/V and the MLP's fused gate and up are shapes the 4D layout must split right."""
    schedule, path = export(tmp_path, plan, 4, model=TINY_LLAMA)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


def test_numerics_fail_when_a_wrong_group_is_injected(tmp_path, capsys):
    schedule, _ = export(tmp_path, "gx=2,gy=2", 4)
    _, path = with_group_moved(schedule, 0, "qkv", "ar_y", "x", tmp_path)  # layer 0's QKV all-reduce over X, not Y
    rc = main(["run", str(path), "--nproc", "4", "--check-numerics", "--out", str(tmp_path / "num"),
               "--wall-timeout", str(LIMIT_S)])
    out = capsys.readouterr()
    assert rc == 1
    assert "FAILED" in out.out and "L0.qkv mb0 O: relative error" in out.out
    assert "numerics check failed" in out.err


def test_numerics_fail_when_a_sequence_gather_uses_the_wrong_group(tmp_path):
    schedule, _ = export(tmp_path, "gx=2,gz=2,sp=1", 4)
    # layer 1's MLP-up input gather (forward and recompute) over Z instead of X: rows of the wrong sequence shard
    bad, path = with_group_moved(schedule, 1, "mlp_up", "ag_x", "z", tmp_path)
    result = numerics(bad, path, tmp_path / "num")
    assert not result["ok"]
    assert any("L1.mlp_up mb0 O: relative error" in f for f in result["failures"]), result["failures"]


def test_numerics_pass_for_ring_attention_with_context_parallelism(tmp_path):
    """cp=2 on 4 ranks: ring attention's O, dQ, dK and dV (executor.ring_numerics) and the linears on half the
    tokens each, with gradients summed over cp."""
    schedule, path = export(tmp_path, "gx=2,cp=2", 4)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]
    # per rank: 9 linears (O, dI, dW) and 2 layers' attention (O of forward and recompute, dQ, dK, dV)
    assert result["checks"] == 4 * (9 * 3 + 2 * 5)


def test_numerics_fail_when_ring_attention_shifts_k_and_v_to_the_wrong_peer(tmp_path):
    schedule, _ = export(tmp_path, "gx=2,cp=2", 4)
    bad, path = with_group_moved(schedule, 1, "attn", "kv_shift", "x", tmp_path)  # to the X neighbour: other heads
    result = numerics(bad, path, tmp_path / "num")
    assert not result["ok"]
    assert any("L1.attn mb0 O.fwd: relative error" in f for f in result["failures"]), result["failures"]
    assert not any("L0." in f for f in result["failures"])


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["cp=4", "cp=2,gdata=2,zero=1,mbs=2", "cp=2,gz=2,zero=3", "tp=2,cp=2,sp=1,mbs=4",
                                  "cp=2,pp=2,mbs=1"])
def test_numerics_pass_for_more_context_parallel_plans(tmp_path, plan):
    schedule, path = export(tmp_path, plan, 4)
    result = numerics(schedule, path, tmp_path / "num")
    assert result["ok"], result["failures"]


# ---- failures ---------------------------------------------------------------------------------


def test_a_killed_rank_ends_the_run_with_a_message_naming_rank_and_op(tmp_path, monkeypatch):
    schedule, path = export(tmp_path, "gx=2,gz=2", 4)
    op = 20
    name = schedule.programs[0].ops[op].name
    monkeypatch.setenv("EXATWIN_FAULT", f"kill:rank=1:step=1:op={op}")
    start = time.perf_counter()
    with pytest.raises(TwinError) as err:
        run_local(schedule, path, 4, str(tmp_path / "run"), WorkerOptions(steps=2, warmup=1), LIMIT_S)
    elapsed = time.perf_counter() - start
    message = str(err.value)
    assert f"rank 1 died (signal SIGKILL) in step 1 at op {op} '{name}'" in message
    assert "\n" not in message
    assert elapsed < 60


@pytest.mark.slow
def test_a_hung_rank_times_out_instead_of_hanging(tmp_path, monkeypatch):
    schedule, path = export(tmp_path, "gx=2", 2)
    monkeypatch.setenv("EXATWIN_FAULT", "hang:rank=1:step=0:op=3")
    start = time.perf_counter()
    with pytest.raises(TwinError) as err:
        run_local(schedule, path, 2, str(tmp_path / "run"), WorkerOptions(steps=1, warmup=0, timeout_s=5), LIMIT_S)
    assert time.perf_counter() - start < 60
    message = str(err.value)
    ops = schedule.programs[0].ops
    joined = next(op for op in ops[4:] if op.is_comm)  # the first collective after the hang: rank 1 never joins it
    assert "rank 0" in message and f"op {joined.id} '{joined.name}'" in message
    assert "rank 1 died" in message  # stopped by torchrun once rank 0 failed


# ---- calibrate and compare ----------------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_writes_a_machine_the_simulator_loads(tmp_path):
    from executor.calibrate_host import calibrate_host

    path = tmp_path / "here.toml"
    launched = []
    fitted, doc, _ = calibrate_host(2, str(path), str(tmp_path / "cal"), WorkerOptions(steps=1, warmup=0), repeats=1,
                                    wall_limit_s=LIMIT_S, launches=2, on_launch=lambda k, s: launched.append(k))
    machine = load_machine(str(path))
    assert machine.node.gpus_per_node == 2
    assert fitted.gemm_flop_per_s > 0 and fitted.port_bw_bytes_per_s > 0
    assert {"gemm", "elementwise", "attention", "all_reduce"} <= set(doc["simulator_vs_measured"])
    saved = json.loads((tmp_path / "here.calibration.json").read_text())
    assert launched == [1, 2] and len(saved["launch_samples"]) == 2  # each launch kept, the median fitted
    assert {"GEMM", "hop latency", "lag per second of compute"} <= set(saved["launch_spread"])  # each alone
    def keys(samples):
        return {json.dumps([s["kind"], s["params"]], sort_keys=True) for s in samples}
    # One sample per microbenchmark any launch measured; a launch may lack an overlap GEMM that never ran
    # wholly inside its all-reduce (collect drops those), never anything else.
    assert set().union(*(keys(launch) for launch in saved["launch_samples"])) == keys(saved["samples"])
    for launch in saved["launch_samples"]:
        assert {json.loads(k)[0] for k in keys(saved["samples"]) - keys(launch)} <= {"overlap_during"}


@pytest.mark.slow
def test_compare_prints_classes_and_step_and_draws_figures(tmp_path, capsys):
    model = get_model("tiny")
    built = build_step(model, parse_plan("gx=2,global_batch=8"), load_machine("local"), 2)
    path = tmp_path / "step.json"
    save_schedule(built.schedule, path)
    prefix = str(tmp_path / "fig")
    rc = main(["compare", str(path), "--machine", "local", "--steps", "2", "--warmup", "1", "--out", str(tmp_path / "cmp"),
               "--figures", prefix, "--wall-timeout", str(LIMIT_S)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "all_reduce" in out and "gemm" in out and "step time" in out
    for suffix in ("-scatter.png", "-timeline.png"):
        assert os.path.getsize(prefix + suffix) > 1000
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert {r["op_class"] for r in doc["by_class"]} >= {"gemm", "attention", "elementwise", "all_reduce"}


def test_numerics_refuse_a_tp_overlapped_plan(tmp_path, capsys):
    """tpo=1 splits GEMMs into chunks the numerics check does not bind: a one-line refusal, exit 2."""
    _, path = export(tmp_path, "tp=2,sp=1,tpo=1,mbs=1", 2)
    rc = main(["run", path, "--nproc", "2", "--check-numerics", "--out", str(tmp_path / "num")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "tpo=1" in err[0] and "tpo=0" in err[0]


def test_all_gathered_context_parallel_attention_runs_and_numerics_refuse_it(tmp_path, capsys):
    """cpcomm=allgather: its K/V all-gathers and dK/dV reduce-scatters over cp run on gloo and every op is timed;
    --check-numerics, which binds ring attention, refuses it in one line naming the plan to check instead."""
    schedule, path = export(tmp_path, "cp=2,mbs=1,cpcomm=allgather", 2)
    run_local(schedule, path, 2, str(tmp_path / "run"), WorkerOptions(steps=1, warmup=0), LIMIT_S)
    record = json.loads((tmp_path / "run" / "rank0.json").read_text())
    assert len(record["steps"]) == 1 and len(record["steps"][0]["end"]) == len(schedule.programs[0].ops)
    rc = main(["run", path, "--nproc", "2", "--check-numerics", "--out", str(tmp_path / "num")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cpcomm=allgather" in err[0] and "cpcomm=p2p" in err[0]


def test_a_blocking_collectives_wake_up_is_recorded_beside_its_end(tmp_path):
    """On CPU a comm op the host blocked on ends when the host resumes; each step also records, per such op, the
    seconds from its completion to the resume (StepRecord.woke), which benchmarks/wake_ups.py reads: only comm
    ops, none negative, and the forward's blocking all-reduces of tp=2 among them."""
    schedule, path = export(tmp_path, "tp=2,mbs=1,oar=0", 2)
    run_local(schedule, path, 2, str(tmp_path / "run"), WorkerOptions(steps=2, warmup=1), LIMIT_S)
    ranks = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in range(2)]
    comm = {op.id for op in schedule.programs[0].ops if op.is_comm}
    for record in ranks:
        for step in record["steps"]:
            woke = {int(k): v for k, v in step["woke"].items()}
            assert woke and set(woke) <= comm and min(woke.values()) >= 0.0
    row = wake_ups(ranks, "run")
    assert row["waits_per_step"] >= 1 and 0.0 <= row["mean_s"] <= row["step_s"]


def test_collective_split_reads_a_real_runs_waits_and_transfers_beside_the_simulated_ones(tmp_path, capsys):
    """benchmarks/collective_split.py on a fit_local-shaped folder holding one real 2-rank gloo run of tp=2: a
    measured and a simulated wait (the last member's issue behind the mean) and transfer for every collective
    of the program, none negative, and the sums by axis, kind and pass adding up to them."""
    machine = Path(__file__).resolve().parents[1] / "topologies" / "local.toml"
    (tmp_path / "local-4.toml").write_text(machine.read_text())
    schedule, path = export(tmp_path, "tp=2,mbs=1", 2, name="4-tiny-tp2.json")
    run_local(schedule, path, 2, str(tmp_path / "4-tiny-tp2"), WorkerOptions(steps=2, warmup=1), LIMIT_S)
    (tmp_path / "held-out-runs.json").write_text(json.dumps([{"schedule": path}]))
    assert collective_split(["--out", str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)[str(tmp_path)]
    collectives = [op for op in schedule.programs[0].ops if isinstance(op.work, Collective)]
    assert row["plan"] == "4-tiny-tp2" and [o["op"] for o in row["ops"]] == [op.id for op in collectives]
    assert all(o[part] >= 0 for o in row["ops"] for part in PARTS)
    for key in PARTS:
        assert sum(k[key] for k in row["kinds"]) == pytest.approx(sum(o[key] for o in row["ops"]))
    assert sum(k["ops"] for k in row["kinds"]) == len(collectives)
    assert collective_split(["--out", str(tmp_path), "--lags", "--json"]) == 0
    lags = json.loads(capsys.readouterr().out)["lags"]  # the pairs' waits by the compute before them
    assert lags and {r["members"] for r in lags} == {2} and all(r["calibrated_s"] >= 0 for r in lags)
    assert sum(r["points"] for r in lags) == len(collectives) * 2  # each collective in each measured step
    with pytest.raises(SystemExit) as stop:  # a --plan no held-out plan's name contains: one line, exit 2
        collective_split(["--out", str(tmp_path), "--plan", "gz9"])
    assert stop.value.code == 2 and "--plan gz9" in capsys.readouterr().err
