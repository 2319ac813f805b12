"""The executor's torch-free parts: wait placement, channels, calibration fit, measured files, launcher messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields

import pytest

from helpers import REPO, op_by_name
from topologies import load_machine
from twin.build import build_step
from twin.errors import TwinError
from twin.model import get_model
from twin.plan import parse_plan

from executor.program import channel_keys, compile_rank
from test_calibration_fit import synthetic_samples


def tiny_schedule(plan: str, gpus: int, batch: int = 8):
    model = get_model("tiny")
    return build_step(model, parse_plan(plan, parse_plan(f"global_batch={batch}")), load_machine("frontier"), gpus).schedule


def waited_at(rp) -> dict[int, int]:
    """comm op id -> id of the op before which the host waits for it."""
    return {w: rop.op.id for rop in rp.ops for w in rop.waits}


# ---- compile: channels and waits --------------------------------------------------------------


def test_channels_are_one_per_group_and_stream():
    s = tiny_schedule("gx=2,gz=2", 4)
    assert [(k.axis, k.lane) for k in channel_keys(s)] == [("x", "comm:x"), ("z", "comm:z")]
    rp = compile_rank(s, 2)
    assert {c.key.axis: (c.members, c.position) for c in rp.channels} == {"x": ((2, 3), 0), "z": ((0, 2), 1)}


def test_oar_waits_for_the_backward_all_reduce_after_the_dw_gemm():
    s = tiny_schedule("gx=2,gz=2", 4)
    rp = compile_rank(s, 0)
    ops = op_by_name(s.programs[0])
    where = waited_at(rp)
    ar, dw = ops["mb0.bwd.L1.mlp_up.ar_x"], ops["mb0.bwd.L1.mlp_up.dW"]
    assert ar.id not in rp.ops[dw.id].waits  # the dW GEMM overlaps the all-reduce
    assert where[ar.id] > dw.id
    # without OAR the host waits for it before the dW GEMM
    s0 = tiny_schedule("gx=2,gz=2,oar=0", 4)
    ops0 = op_by_name(s0.programs[0])
    assert waited_at(compile_rank(s0, 0))[ops0["mb0.bwd.L1.mlp_up.ar_x"].id] == ops0["mb0.bwd.L1.mlp_up.dW"].id


def test_ors_reduce_scatters_are_waited_only_after_the_backward():
    s = tiny_schedule("gx=2,gz=2", 4)
    rp = compile_rank(s, 0)
    names = [op.name for op in s.programs[0].ops]
    last_bwd = max(i for i, n in enumerate(names) if ".bwd." in n)
    scatters = [i for i, n in enumerate(names) if n.endswith(".rs_z")]
    where = waited_at(rp)
    # each is ordered by its channel or waited after the whole backward, never inside it
    assert scatters and all(where.get(i, len(names)) > last_bwd for i in scatters)


def test_the_prefetched_all_gather_is_not_waited_before_its_gemm_is_next():
    s = tiny_schedule("gz=2", 2)
    ops = op_by_name(s.programs[0])
    rp = compile_rank(s, 0)
    ag = ops["mb0.fwd.L0.attn_out.ag_z"]  # issued one linear ahead (OAG)
    assert ag.id < ops["mb0.fwd.L0.qkv.gemm"].id
    assert waited_at(rp)[ag.id] == ops["mb0.fwd.L0.attn_out.gemm"].id


def test_every_comm_op_is_waited_once_or_at_the_end():
    for plan, gpus in (("gx=2,gy=2", 4), ("tp=2,pp=2,mbs=1", 4), ("gz=2,gdata=2,zero=1", 4)):
        s = tiny_schedule(plan, gpus)
        for rank in range(gpus):
            rp = compile_rank(s, rank)
            waits = [w for rop in rp.ops for w in rop.waits]
            assert len(waits) == len(set(waits))
            comm = {rop.op.id for rop in rp.ops if rop.comm}
            assert set(waits) | set(rp.final_waits) == comm
            assert not set(waits) & set(rp.final_waits)


def test_pipeline_transfers_have_their_peer_and_a_channel_per_tag():
    s = tiny_schedule("tp=2,pp=2,mbs=1", 4)
    lanes = {k.lane for k in channel_keys(s) if k.axis == "pp"}
    assert lanes == {"p2p:act", "p2p:grad"}
    sends = [rop for rop in compile_rank(s, 1).ops if rop.comm and rop.op.work.kind == "send"]
    recvs = [rop for rop in compile_rank(s, 3).ops if rop.comm and rop.op.work.kind == "recv"]
    assert {r.peer for r in sends} == {3} and {r.peer for r in recvs} == {1}


def test_compile_rejects_a_rank_outside_the_schedule():
    with pytest.raises(TwinError, match="outside"):
        compile_rank(tiny_schedule("gx=2", 2), 5)


# ---- measured files -> trace and summary -----------------------------------------------------------


def fake_rank_files(out, schedule, offsets=(0.0, 0.002), steps=3):
    """Rank files as the worker writes them: rank r's ops back to back, 1 ms each, started at t0 + offset."""
    for r in range(schedule.world_size):
        program = schedule.programs[schedule.program_of()[r]]
        n = len(program.ops)
        rec = []
        for s in range(steps):
            start = [i * 1e-3 for i in range(n)]
            rec.append({"t0": 100.0 + s + offsets[r], "start": start, "end": [x + 1e-3 * (1 + s) for x in start]})
        data = {"rank": r, "program": schedule.program_of()[r], "host": "h", "pid": r, "device": "cpu",
                "device_name": "cpu", "backend": "gloo", "dtype": "float32", "dtype_note": "test", "torch": "x",
                "threads": 1, "compile_s": 0.1, "buffer_bytes": 0, "tuned_layouts": {}, "steps": rec}
        (out / f"rank{r}.json").write_text(json.dumps(data))


def test_measured_run_becomes_the_simulators_trace_and_summary(tmp_path):
    from executor.measured import finish_run, load_measured
    from twin.report import Summary

    s = tiny_schedule("gx=2", 2)
    fake_rank_files(tmp_path, s)
    m = load_measured(str(tmp_path), s)
    n = len(s.programs[0].ops)
    # one host: rank 1 started 2 ms late, so the step ends at its last op
    assert m.step_times_s[0] == pytest.approx(0.002 + (n - 1) * 1e-3 + 1e-3)
    assert m.median_step == 1
    summary = finish_run(str(tmp_path), s, "step.json", None)
    assert set(summary) == {f.name for f in fields(Summary)}
    trace = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * n
    assert {e["pid"] for e in spans} == {0, 1}
    assert trace["otherData"]["measured"] is True
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["dtype"] == "float32" and len(run["step_times_s"]) == 3


# ---- launcher messages -------------------------------------------------------------------------


def test_failure_message_names_the_dead_rank_and_its_op(tmp_path):
    import struct

    from executor.launch import explain_failure

    s = tiny_schedule("gx=2", 2)
    name = s.programs[0].ops[7].name
    (tmp_path / "progress-rank1.bin").write_bytes(struct.pack("qq", 2, 7))
    (tmp_path / "progress-rank0.bin").write_bytes(struct.pack("qq", 2, 9))
    (tmp_path / "error-rank0.json").write_text(json.dumps(
        {"rank": 0, "step": 2, "op": 9, "message": "rank 0, step 2: waiting for op 9 'x' failed: Connection closed by peer"}))
    log = tmp_path / "torchrun.log"
    log.write_text("  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 99)\n")
    msg = explain_failure(s, str(tmp_path), 1, str(log), 60)
    assert f"rank 1 died (signal SIGKILL) in step 2 at op 7 '{name}'" in msg
    assert "rank 0, step 2: waiting for op 9" in msg and "\n" not in msg


def test_srun_lines_carry_the_site_environment():
    from executor.launch import WorkerOptions, srun_script

    s = tiny_schedule("gx=2,gdata=8", 16)
    text = srun_script("frontier", s, "step.json", "out/run", WorkerOptions())
    assert "srun -N 2 -n 16 --ntasks-per-node=8" in text
    assert "FI_PROVIDER=cxi" in text and "CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert "NCCL_PROTO=^LL128" in srun_script("alps", s, "step.json", "out/run", WorkerOptions())
    assert "--profile-steps 2" in srun_script("frontier", s, "step.json", "out/run", WorkerOptions(profile_steps=2))
    assert "--profile-steps" not in text
    with pytest.raises(TwinError, match="frontier"):
        srun_script("atlantis", s, "step.json", "out/run", WorkerOptions())


# ---- CLI without torch -------------------------------------------------------------------------


def test_twin_runs_without_torch_and_run_says_how_to_get_it(tmp_path):
    path = tmp_path / "step.json"
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from twin.cli import main\n"
        f"rc = main(['export', '--machine', 'frontier', '--model', 'tiny', '--gpus', '2', '--plan', 'gx=2', '--global-batch', '8', '-o', {str(path)!r}])\n"
        "assert rc == 0\n"
        f"sys.exit(main(['run', {str(path)!r}, '--nproc', '2']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "twin: error: twin run needs torch: pip install -e '.[torch]'"


def test_importing_the_executor_cli_does_not_import_torch():
    code = "import sys, twin.cli; twin.cli.build_parser(); import executor.cli, executor.launch, executor.measured, executor.compare, executor.calibrate; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip() == "False", proc.stderr


def test_srun_launcher_prints_without_torch(tmp_path, capsys):
    from twin.cli import main

    path = tmp_path / "step.json"
    assert main(["export", "--machine", "perlmutter", "--model", "tiny", "--gpus", "8", "--plan", "gx=4,gdata=2",
                 "--global-batch", "8", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--launcher", "srun", "--machine", "perlmutter"]) == 0
    out = capsys.readouterr().out
    assert "srun -N 2 -n 8" in out and "python -m executor.worker" in out
    # the replicas outermost: the same lines (each worker takes the rank its GPU holds: twin.mesh.rank_on_gpu)
    assert main(["export", "--machine", "perlmutter", "--model", "tiny", "--gpus", "8", "--plan",
                 "gx=2,gdata=2,pp=2,dpouter=1", "--global-batch", "8", "-o", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--launcher", "srun", "--machine", "perlmutter"]) == 0
    assert "srun -N 2 -n 8" in capsys.readouterr().out


def test_per_kind_collective_parameters_reach_the_simulated_step(tmp_path):
    """A calibrated kind_latency/kind_bw_fraction slows that kind in a simulated step, as in time_alone_s."""
    from executor import calibrate as cal
    from executor.machinefile import write_machine
    from topologies.fabric import Fabric
    from twin.builders.program import ProgramWriter
    from twin.ir import Collective, GroupAxis, Program, Schedule, StepInfo
    from twin.sim.collectives import CollectiveModel
    from twin.sim.engine import simulate

    truth = {"overhead": float(cal.OVERHEADS_S[20]), "bw": 10e9, "rate": 100e9, "tile_m": 32, "tile_n": 64,
             "k_half": 64.0, "layouts": {"NN": 1.0, "NT": 0.9, "TN": 0.8}, "attention": 0.5, "attention_over": 0.0,
             "base": 100e-6, "hop": 50e-6, "port": 1e9,
             "kind_latency": {"all_reduce": 0.0, "all_gather": 0.0, "reduce_scatter": 400e-6},
             "kind_fraction": {"all_reduce": 1.0, "all_gather": 1.0, "reduce_scatter": 0.5}}
    samples = synthetic_samples(truth)
    path = tmp_path / "kinds.toml"
    write_machine(str(path), cal.fit(samples), samples, {"cpu": "c", "logical_cpus": 2, "memory_bytes": 8e9, "nproc": 4,
                                                         "hostname": "h"}, "float32", date="2026-01-01")
    machine = load_machine(str(path))
    model = CollectiveModel(Fabric(machine, 4))
    step = {}
    for kind in ("all_gather", "reduce_scatter"):
        w = ProgramWriter()
        w.wait(w.collective("c", "g", Collective(kind, "g", 8 << 20, "bf16")))
        info = StepInfo(model="m", plan=None, label="p", global_batch=1, seq=1, flops_hardware=0.0, flops_model=0.0,
                        memory_per_gpu_bytes=0.0)
        schedule = Schedule(4, (GroupAxis("g", ((0, 1, 2, 3),)),), (Program((0, 1, 2, 3), tuple(w.ops)),), info)
        step[kind] = simulate(schedule, machine).step_time_s
        lowering, protocol = model.choose((0, 1, 2, 3), kind, 8 << 20)
        assert step[kind] == pytest.approx(model.time_alone_s(lowering, protocol, 8 << 20), rel=1e-6)
    traffic = 3 / 4 * (8 << 20)
    assert step["reduce_scatter"] - step["all_gather"] == pytest.approx(400e-6 + traffic / 1e9, rel=1e-3)


def test_each_worker_takes_the_rank_its_gpu_holds_and_keeps_its_slot_where_the_schedule_does_not_load(tmp_path):
    """executor.worker._load (torch-free): with dpouter the process on GPU slot g runs twin.mesh.rank_on_gpu's rank,
    every slot a different rank; without it, the slot; a schedule that does not load keeps the slot (the worker
    then reports the loader's error)."""
    from executor.worker import _load
    from twin.ir_io import save_schedule
    from twin.mesh import rank_gpus

    for plan, order in (("gx=2,gdata=2,pp=2,dpouter=1", True), ("gx=2,gdata=2,pp=2", False)):
        schedule = tiny_schedule(plan, 8)
        path = tmp_path / "step.json"
        save_schedule(schedule, path)
        ranks = [_load(str(path), slot)[1] for slot in range(8)]
        placed = rank_gpus(schedule.info.plan)
        assert ranks == ([placed.index(g) for g in range(8)] if order else list(range(8)))
        assert sorted(ranks) == list(range(8)) and (ranks != list(range(8))) == order
    assert _load(str(tmp_path / "missing.json"), 5) == (None, 5)
