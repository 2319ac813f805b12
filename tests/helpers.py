"""Helpers shared by the core tests: hand-made machines and schedule queries.

The small test machines written here (equal links, efficiencies 1, a single
"simple" protocol) are simple enough that the time of a lone collective can be
worked out by hand.
"""

from __future__ import annotations

from pathlib import Path

from topologies import load_machine
from twin.ir import Op, Program

REPO = Path(__file__).resolve().parents[1]

# A small model every builder/simulator test can afford (a few hundred ops).
SMALL_SPEC = "layers=2,hidden=512,heads=8,seq=128,vocab=1024"


# ---- Megatron's softmax on the attention scores ------------------------------
# Written from Megatron-DeepSpeed c08e2cc2 (megatron/model/fused_softmax.py, is_kernel_available and
# forward_torch_softmax; csrc scaled_masked_softmax.h, get_batch_per_block), not from the builder: the fused causal
# kernel needs 16-bit scores, 16 < seq <= 4096, seq % 4 == 0 and mbs x local heads a multiple of the rows one
# 128-thread block takes (warps of 32 threads, one row each, two where seq <= 128). Otherwise torch's softmax in
# fp32 with query-key layer scaling: cast, scale, masked_fill_, softmax, cast back, and the five backwards in
# reverse. (role, bytes per score element read + written)
FUSED_SOFTMAX = [("softmax", 2 + 2)]
FUSED_SOFTMAX_BACKWARD = [("softmax_bwd", 2 + 2 + 2)]
TORCH_SOFTMAX = [("softmax_to_fp32", 2 + 4), ("softmax_scale", 4 + 4), ("softmax_mask", 4 + 4), ("softmax", 4 + 4),
                 ("softmax_to_16bit", 4 + 2)]
TORCH_SOFTMAX_BACKWARD = [("softmax_to_16bit_bwd", 2 + 4), ("softmax_bwd", 4 + 4 + 4), ("softmax_mask_bwd", 4 + 4),
                          ("softmax_scale_bwd", 4 + 4), ("softmax_to_fp32_bwd", 4 + 2)]


def megatron_softmax(seq: int, attention_batches: int, backward: bool) -> list[tuple[str, int]]:
    """The softmax kernels of one layer's unfused attention, one direction, on 16-bit scores."""
    rows_per_block = 2 * 128 // 32 if seq <= 128 else 128 // 32
    fused = 16 < seq <= 4096 and seq % 4 == 0 and attention_batches % rows_per_block == 0
    if fused:
        return FUSED_SOFTMAX_BACKWARD if backward else FUSED_SOFTMAX
    return TORCH_SOFTMAX_BACKWARD if backward else TORCH_SOFTMAX


# ---- hand-made machines ------------------------------------------------------

_DEVICE = """
[machine]
name = "{name}"
description = "test machine"

[device]
name = "fake"
peak_bf16_tflop_per_s = {{ value = 100, estimate = "test" }}
empirical_gemm_bf16_tflop_per_s = {{ value = 80, estimate = "test" }}
hbm_gb = {{ value = 16, estimate = "test" }}
hbm_bw_gb_per_s = {{ value = 1000, estimate = "test" }}
compute_units = {{ value = 10, estimate = "test" }}
gemm_tile_m = {{ value = 128, estimate = "test" }}
gemm_tile_n = {{ value = 128, estimate = "test" }}
gemm_k_half = {{ value = 64, estimate = "test" }}
layout_penalty_min_dim = {{ value = 0, estimate = "test" }}
attention_efficiency = {{ value = 0.5, estimate = "test" }}
hbm_efficiency = {{ value = 0.8, estimate = "test" }}
comm_compute_slowdown = {{ value = {slowdown}, estimate = "test" }}
kernel_overhead_us = {{ value = {overhead_us}, estimate = "test" }}
layout_efficiency = {{ nn = {{ value = 1, estimate = "t" }}, nt = {{ value = 1, estimate = "t" }}, tn = {{ value = 1, estimate = "t" }} }}
"""

_REST = """
[network]
kind = "dragonfly"
nodes_per_group = {{ value = 2, estimate = "t" }}
switches_per_group = {{ value = 2, estimate = "t" }}
endpoint_ports_per_switch = {{ value = 1, estimate = "t" }}
global_links_per_group_pair = {{ value = 2, estimate = "t" }}
link_bw_per_direction_gb_per_s = {{ value = {net_gb}, estimate = "t" }}
n_groups = {{ value = 3, estimate = "t" }}

[collectives]
protocols = {{ allowed = ["simple"], estimate = "t" }}
base_latency_us = {{ ring = {{ simple = {{ value = {ring_base_us}, estimate = "t" }} }}, tree = {{ simple = {{ value = {tree_base_us}, estimate = "t" }} }} }}
intra_hop_latency_us = {{ simple = {{ value = {intra_us}, estimate = "t" }} }}
inter_hop_latency_us = {{ simple = {{ value = {inter_us}, estimate = "t" }} }}
protocol_bw_fraction = {{ simple = {{ value = 1, estimate = "t" }} }}
"""

# Latency parameters of the hand-made machines, in seconds (what the TOML says in us).
RING_BASE_S = 8e-6
TREE_BASE_S = 50e-6  # larger than the ring's, so the tuner picks the ring where both apply
INTRA_HOP_S = 3e-6
INTER_HOP_S = 14e-6


def _write(tmp_path: Path, name: str, node: str, slowdown: float, overhead_us: float, net_gb: float):
    text = _DEVICE.format(name=name, slowdown=slowdown, overhead_us=overhead_us) + node + _REST.format(
        net_gb=net_gb, ring_base_us=RING_BASE_S * 1e6, tree_base_us=TREE_BASE_S * 1e6,
        intra_us=INTRA_HOP_S * 1e6, inter_us=INTER_HOP_S * 1e6,
    )
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return load_machine(str(path))


def quad_machine(tmp_path: Path, link_gb: float = 10.0, slowdown: float = 0.2, overhead_us: float = 5.0,
                 shared_cores: float = 0.0, timeslice_skew: float | None = None, comm_stretch: float | None = None,
                 latency_pace: float | None = None, timeslice_lag_us: float | None = None,
                 timeslice_lag_after_us: float | None = None, comm_core_share: float | None = None,
                 timeslice_lag_span_us: float | None = None, timeslice_skew_beyond_span: float | None = None):
    """4 GPUs per node, every pair joined by one equal link of `link_gb` GB/s per direction; 1 NIC. With
    `shared_cores`, the 4 devices are ranks sharing that many cores (a CPU host), lagging by
    `timeslice_skew` (plus `timeslice_lag_us` after `timeslice_lag_after_us` of compute; past
    `timeslice_lag_span_us` of it `timeslice_skew_beyond_span` per second instead) and their transfers
    `comm_stretch` times longer when more of them compute than there are cores, a transfer's latency at
    `latency_pace` while its own ranks compute, a rank moving bytes beside no compute of its own taking
    `comm_core_share` of a core."""
    links = ",\n".join(
        f'  {{ a = {a}, b = {b}, count = 1, kind = "wire", '
        f'bw_per_direction_gb_per_s = {{ value = {link_gb}, estimate = "t" }}, estimate = "t" }}'
        for a in range(4) for b in range(a + 1, 4)
    )
    cores = f'shared_cores = {{ value = {shared_cores}, estimate = "test" }}\n' if shared_cores else ""
    if timeslice_skew is not None:
        cores += f'timeslice_skew = {{ value = {timeslice_skew}, estimate = "test" }}\n'
    if comm_stretch is not None:
        cores += f'comm_stretch_under_compute = {{ value = {comm_stretch}, estimate = "test" }}\n'
    if latency_pace is not None:
        cores += f'comm_latency_pace_under_compute = {{ value = {latency_pace}, estimate = "test" }}\n'
    for key, value in (("timeslice_lag_us", timeslice_lag_us), ("timeslice_lag_after_us", timeslice_lag_after_us),
                       ("comm_core_share", comm_core_share), ("timeslice_lag_span_us", timeslice_lag_span_us),
                       ("timeslice_skew_beyond_span", timeslice_skew_beyond_span)):
        if value is not None:
            cores += f'{key} = {{ value = {value}, estimate = "test" }}\n'
    node = f"""
[node]
gpus_per_node = {{ value = 4, estimate = "test" }}
{cores}links = [
{links}
]
nics = [
  {{ index = 0, attach_gpu = 0, bw_per_direction_gb_per_s = {{ value = 5, estimate = "t" }}, attach_bw_per_direction_gb_per_s = {{ value = 8, estimate = "t" }}, estimate = "t" }},
]
link_efficiency = {{ wire = {{ value = 1, estimate = "t" }}, nic = {{ value = 1, estimate = "t" }}, attach = {{ value = 1, estimate = "t" }} }}
"""
    return _write(tmp_path, "quad", node, slowdown, overhead_us, net_gb=5.0)


def single_gpu_nodes_machine(tmp_path: Path, nic_gb: float, attach_gb: float, net_gb: float):
    """1 GPU per node, one NIC on it; 2 nodes per group on 2 switches (the nodes sit on different switches)."""
    node = f"""
[node]
gpus_per_node = {{ value = 1, estimate = "test" }}
nics = [
  {{ index = 0, attach_gpu = 0, bw_per_direction_gb_per_s = {{ value = {nic_gb}, estimate = "t" }}, attach_bw_per_direction_gb_per_s = {{ value = {attach_gb}, estimate = "t" }}, estimate = "t" }},
]
link_efficiency = {{ nic = {{ value = 1, estimate = "t" }}, attach = {{ value = 1, estimate = "t" }} }}
"""
    return _write(tmp_path, "solo", node, 0.1, 5.0, net_gb=net_gb)


# ---- schedule helpers ----------------------------------------------------------


def valid_plan(text: str, model, global_batch: int):
    """The plan `text` over a step of `global_batch` sequences, validated for `model` on its own GPU count."""
    from twin.plan import ParallelPlan, parse_plan
    from twin.plan_checks import validate_plan

    plan = parse_plan(text, ParallelPlan(global_batch=global_batch))
    validate_plan(plan, model, plan.world_size)
    return plan


def op_by_name(program: Program) -> dict[str, Op]:
    out: dict[str, Op] = {}
    for op in program.ops:
        assert op.name not in out, f"duplicate op name {op.name}"
        out[op.name] = op
    return out


def happens_before(program: Program) -> list[set[int]]:
    """For each op, the ids of every op that must complete before it starts.

    The IR's semantics: an op waits for its `deps` and for the previous op on
    its stream; closed transitively.
    """
    before: list[set[int]] = []
    last_on_stream: dict[str, int] = {}
    for op in program.ops:
        direct = set(op.deps)
        if op.stream in last_on_stream:
            direct.add(last_on_stream[op.stream])
        closure = set(direct)
        for d in direct:
            assert d < op.id, f"op {op.id} depends on later op {d}"
            closure |= before[d]
        before.append(closure)
        last_on_stream[op.stream] = op.id
    return before


# ---- search helpers ------------------------------------------------------------


def check_search_bounds_and_ranking(model, machine, gpus: int, batch: int, space, top: int):
    """Every plan of `space` that fits: 0 < its screening bound <= its simulated step, and its full bound too; then
    branch and bound ranks the top `top` exactly as simulating every plan does. Returns (plans, pruned, every): the
    candidates' plans and both searches' results, for the caller's own checks."""
    from twin.search import rank
    from twin.search.bound import BoundModel
    from twin.search.rank import search
    from twin.search.screen import ScreenModel
    from twin.search.space import enumerate_space

    plans = [c.plan for c in enumerate_space(model, gpus, batch, machine.device.hbm_bytes, space).candidates]
    screen = ScreenModel(model, BoundModel(machine, gpus))
    rank._init_worker(model, machine, gpus)
    for p in plans:
        step = rank._simulate_plan(p).step_time_s
        assert 0 < screen.bound_s(p) <= step * (1 + 1e-9), p.describe()
        assert rank._bound_of(p) <= step * (1 + 1e-9), p.describe()
    pruned = search(model, gpus, batch, machine, space, top=top, use_cache=False, jobs=1)
    every = search(model, gpus, batch, machine, space, top=top, exhaustive=True, use_cache=False, jobs=1)
    assert [(r.plan, r.step_time_s) for r in pruned.ranked] == [(r.plan, r.step_time_s) for r in every.ranked]
    return plans, pruned, every


def assert_switch_shows_and_slows(model, text: str, switch: str, machine_name: str, global_batch: int) -> None:
    """A plan switch of code-specific kernels (fsdp2, axonn): the plan `text` (which turns `switch` on) writes it
    and reads back the same, the plan without it does not write it, and its step takes longer than without."""
    from dataclasses import replace

    from topologies import load_machine
    from twin.micro_batches import simulate_step
    from twin.plan import ParallelPlan, parse_plan

    p = valid_plan(text, model, global_batch)
    without = replace(p, **{switch: False})
    assert f"{switch}=1" in p.describe() and parse_plan(p.describe(), ParallelPlan(global_batch=global_batch)) == p
    assert switch not in without.describe()
    machine = load_machine(machine_name)
    plain, switched = (simulate_step(model, q, machine, p.world_size).step_time_s for q in (without, p))
    assert switched > plain
