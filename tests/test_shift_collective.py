"""The "shift" collective (ring attention's exchange): IR, simulator lowering and time, executor on gloo.

A shift sends each member's whole buffer to the next member of its instance,
in instance order, the last to the first. The simulator lowers it as one send
per member on the route between neighbours ("neighbour", the only algorithm
that applies); the executor runs it as an all-to-all with one non-empty split
each way. The multi-process tests start one process per rank, each under a
hard time limit, so none can hang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from helpers import INTER_HOP_S, INTRA_HOP_S, REPO, RING_BASE_S, quad_machine, single_gpu_nodes_machine
from topologies.fabric import Fabric
from twin.ir import COLLECTIVE_KINDS, Collective, Gemm, GroupAxis, Op, Program, Schedule, StepInfo
from twin.ir_io import load_schedule, save_schedule
from twin.ir_validate import validate_schedule
from twin.sim.collectives import ALGORITHMS, CollectiveModel, NotApplicable
from twin.sim.engine import simulate

GB = 1e9
INFO = StepInfo(model="hand", plan=None, label="hand", global_batch=1, seq=1, flops_hardware=1.0, flops_model=1.0,
                memory_per_gpu_bytes=0.0)
LIMIT_S = 120  # per multi-process launch
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the executor needs torch")


def schedule(world: int, groups: dict[str, tuple[tuple[int, ...], ...]], ops: list[Op]) -> Schedule:
    """Every rank runs `ops`."""
    return Schedule(world_size=world, groups=tuple(GroupAxis(name, inst) for name, inst in groups.items()),
                    programs=(Program(tuple(range(world)), tuple(ops)),), info=INFO)


def shift(op_id: int, nbytes: float, group: str = "cp", deps: tuple[int, ...] = ()) -> Op:
    return Op(op_id, f"shift{op_id}", f"comm:{group}", Collective("shift", group, nbytes), deps)


def route_loads(fabric: Fabric, pairs) -> dict[int, float]:
    """What the lowering must put on the links: one byte per buffer byte on every link of each pair's route."""
    return dict(Counter(link for src, dst in pairs for link in fabric.route(src, dst)))


# ---- the simulator's lowering -------------------------------------------------------------------


@pytest.fixture(scope="module", params=["perlmutter", "frontier"])
def model(request) -> CollectiveModel:
    return CollectiveModel(Fabric(request.getfixturevalue(request.param), 16))


def test_shift_is_an_ir_kind():
    assert "shift" in COLLECTIVE_KINDS


@pytest.mark.parametrize("gpus", [(0, 1, 2, 3), (0, 2, 1, 3), (3, 1)])
def test_shift_in_one_node_loads_exactly_the_routes_to_the_next_member(model, gpus):
    lowering = model.lowering(gpus, "shift", "neighbour")
    n = len(gpus)
    expected = route_loads(model.fabric, [(gpus[i], gpus[(i + 1) % n]) for i in range(n)])
    assert lowering.phases == (pytest.approx(expected),) and set(lowering.phases[0]) == set(expected)
    assert (lowering.n_ranks, lowering.n_nodes, lowering.ranks_per_node) == (n, 1, n)
    assert "nic" not in {model.fabric.link_kind[link] for link in lowering.phases[0]}


def test_shift_across_nodes_crosses_the_nics(model):
    gpn = model.fabric.machine.node.gpus_per_node
    gpus = (0, 1, gpn, gpn + 1)  # two members on each of two nodes
    lowering = model.lowering(gpus, "shift", "neighbour")
    expected = route_loads(model.fabric, [(0, 1), (1, gpn), (gpn, gpn + 1), (gpn + 1, 0)])
    assert lowering.phases == (pytest.approx(expected),)
    assert (lowering.n_nodes, lowering.ranks_per_node) == (2, 2)
    assert "nic" in {model.fabric.link_kind[link] for link in lowering.phases[0]}


def test_only_the_neighbour_algorithm_carries_a_shift_and_it_carries_nothing_else(model):
    for gpus in [(0,), (0, 1), (0, 1, 2, 3), (0, 5, 9, 13)]:
        assert model.applicable(gpus, "shift") == ("neighbour",)
        assert model.choose(gpus, "shift", 1e6)[0].algorithm == "neighbour"
        for other in set(ALGORITHMS) - {"neighbour"}:
            with pytest.raises(NotApplicable):
                model.lowering(gpus, "shift", other)
    for kind in set(COLLECTIVE_KINDS) - {"shift"}:
        assert "neighbour" not in model.applicable((0, 1, 2, 3), kind)


def test_shift_time_grows_with_its_size_and_one_rank_moves_nothing(model):
    gpus = (0, 1, 2, 3)
    times = []
    for nbytes in (1e3, 1e6, 1e9):
        lowering, protocol = model.choose(gpus, "shift", nbytes)
        times.append(model.time_alone_s(lowering, protocol, nbytes))
    assert 0 < times[0] < times[1] < times[2]
    alone = model.lowering((5,), "shift", "neighbour")
    assert alone.phases == ({},)
    assert all(model.time_alone_s(alone, p, 1e9) == 0 for p in model.tuning.protocols)


# ---- a schedule with a shift: validated, saved, simulated -------------------------------------------


def test_a_shift_in_one_node_takes_one_hop_and_the_buffer_over_one_link(tmp_path):
    """Quad machine: 4 GPUs all joined by equal 10 GB/s links, so each member's send has a link to itself."""
    machine = quad_machine(tmp_path, link_gb=10.0)
    S = 1e9
    sched = schedule(4, {"cp": ((0, 1, 2, 3),)}, [shift(0, S)])
    validate_schedule(sched)
    path = tmp_path / "shift.json"
    save_schedule(sched, path)
    assert load_schedule(path) == sched
    expected = RING_BASE_S + INTRA_HOP_S + S / (10 * GB)
    for full in (False, True):
        assert simulate(sched, machine, full=full).step_time_s == pytest.approx(expected, rel=1e-9)


def test_a_shift_across_nodes_takes_an_inter_node_hop(tmp_path):
    machine = single_gpu_nodes_machine(tmp_path, nic_gb=25.0, attach_gb=50.0, net_gb=40.0)
    S = 2e9
    sched = schedule(2, {"cp": ((0, 1),)}, [shift(0, S)])
    validate_schedule(sched)
    expected = RING_BASE_S + INTER_HOP_S + S / (25 * GB)  # both directions at once, each on its own NIC port
    for full in (False, True):
        assert simulate(sched, machine, full=full).step_time_s == pytest.approx(expected, rel=1e-9)


def test_a_ring_attention_like_step_simulates_on_frontier(frontier):
    """Two context-parallel groups of 4 GCDs, each shifting K/V blocks between attention-sized GEMMs."""
    ops = [Gemm(4096, 4096, 128), Gemm(4096, 4096, 128), Gemm(4096, 4096, 128)]
    program = [Op(0, "qk0", "compute", ops[0]), shift(1, 8e6), Op(2, "qk1", "compute", ops[1], (1,)),
               shift(3, 8e6, deps=(1,)), Op(4, "qk2", "compute", ops[2], (3,))]
    sched = schedule(8, {"cp": ((0, 1, 2, 3), (4, 5, 6, 7))}, program)
    validate_schedule(sched)
    reduced, full = simulate(sched, frontier), simulate(sched, frontier, full=True)
    assert 0 < reduced.step_time_s and full.step_time_s <= reduced.step_time_s * (1 + 1e-9)


# ---- the executor -------------------------------------------------------------------------------

_WORKER = """
import datetime, json, sys
import torch, torch.distributed as dist
from executor.channels import create_channels
from executor.program import compile_rank
from twin.ir_io import load_schedule

rank, world, store, sched_path, out_path = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=30))
schedule = load_schedule(sched_path)
mine = compile_rank(schedule, rank).channels
channels = create_channels(schedule, rank, "gloo", 30.0, mine)
got = {}
for ch in mine:
    for numel in (1, 5, 6):
        inp = torch.arange(numel, dtype=torch.float32) + 1000 * rank
        out = torch.full((numel,), -1.0)
        channels[ch.index].collective("shift", out, inp)().wait()
        got[f"{ch.key.axis}/{numel}"] = out.tolist()
json.dump(got, open(out_path, "w"))
dist.destroy_process_group()
"""


def _run_ranks(tmp_path, sched: Schedule) -> list[dict]:
    """Every rank runs each of its channels' shift, for a few sizes; what each received, per rank."""
    path = tmp_path / "schedule.json"
    save_schedule(sched, path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(rank), str(sched.world_size),
                               str(tmp_path / "store"), str(path), str(tmp_path / f"rank{rank}.json")],
                              env=env, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(sched.world_size)]
    try:
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=LIMIT_S)
            assert proc.returncode == 0, f"rank {rank} failed:\n{out}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(sched.world_size)]


def _expected(instances: tuple[tuple[int, ...], ...], rank: int, numel: int) -> list[float]:
    members = next(m for m in instances if rank in m)
    source = members[(members.index(rank) - 1) % len(members)]
    return [float(i + 1000 * source) for i in range(numel)]


@needs_torch
@pytest.mark.parametrize("groups", [
    {"cp": ((0, 2, 1),)},  # three ranks, in an instance order that is not rank order
    {"cp": ((0, 1), (2, 3)), "solo": ((0,), (1,), (2,), (3,))},  # pairs (next = previous) and lone ranks (a copy)
], ids=["three", "pairs-and-one"])
def test_gloo_shift_delivers_each_rank_its_predecessors_buffer(tmp_path, groups):
    world = 1 + max(r for instances in groups.values() for m in instances for r in m)
    sched = schedule(world, groups, [shift(i, 4.0, axis) for i, axis in enumerate(groups)])
    got = _run_ranks(tmp_path, sched)
    for rank in range(world):
        for axis, instances in groups.items():
            for numel in (1, 5, 6):
                assert got[rank][f"{axis}/{numel}"] == _expected(instances, rank, numel), (rank, axis, numel)


@needs_torch
def test_the_kernel_gives_a_shift_equal_input_and_output():
    import torch

    from executor.kernels import Buffers, collective_fn

    class Recorder:
        members = (0, 1, 2)

        def collective(self, kind, out, inp):
            return kind, out, inp

    bufs = Buffers(torch.device("cpu"), torch.float32)
    kind, out, inp = collective_fn(shift(0, 4 * 10), Recorder(), bufs)
    assert kind == "shift" and out.shape == inp.shape == (12,)  # 10 elements, rounded up to a multiple of 3
    assert out.data_ptr() != inp.data_ptr()


@needs_torch
def test_the_executor_runs_a_step_with_shifts(tmp_path):
    """The whole path (compile, channels, kernels, the timed loop) on 3 gloo ranks started by torchrun."""
    from executor.launch import WorkerOptions, run_local

    ops = [Op(0, "mm", "compute", Gemm(64, 64, 64)), shift(1, 4096.0), shift(2, 4096.0, deps=(0,)),
           Op(3, "mm2", "compute", Gemm(64, 64, 64), (1, 2))]
    sched = schedule(3, {"cp": ((0, 2, 1),)}, ops)
    validate_schedule(sched)
    path = tmp_path / "step.json"
    save_schedule(sched, path)
    out = tmp_path / "run"
    run_local(sched, str(path), 3, str(out), WorkerOptions(steps=2, warmup=1), LIMIT_S)
    for rank in range(3):
        steps = json.loads((out / f"rank{rank}.json").read_text())["steps"]
        assert len(steps) == 2 and all(len(s["end"]) == len(sched.programs[0].ops) for s in steps)
