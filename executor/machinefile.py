"""The machine file `twin calibrate` writes for this host, and the audit of it by the simulator's own models.

The host becomes a one-node machine whose "devices" are the ranks: a
"loopback" node switch (every rank one port of the fitted bandwidth), a
one-node fat tree with a placeholder NIC (the schema wants one; nothing
leaves the host), NCCL's tuning model with a single protocol carrying the
fitted gloo latencies. Every number is either "measured on <host> by twin
calibrate on <date>: <what>" (source) or an estimate saying why it is unused
or fixed. `check_with_simulator` loads the written file with
topologies.machine and predicts each microbenchmark with twin.sim.compute and
twin.sim.collectives, so the JSON beside the file shows what the simulator,
not the fit, makes of it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from dataclasses import asdict

import numpy as np

from executor.calibrate import DTYPE, GEMM_SHAPES, Fit
from executor.calibration_samples import Sample
from twin.ir import Attention, Elementwise, Gemm


def host_description(nproc: int) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    mem = 0.0
    try:
        with open("/proc/meminfo") as f:
            mem = next(float(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count() or 1, "memory_bytes": mem, "nproc": nproc,
            "hostname": platform.node()}


def _short_cpu(cpu: str) -> str:
    """"Intel(R) Xeon(R) Processor @ 2.1GHz" -> "Intel Xeon": a device name that fits a table."""
    words = re.sub(r"\((R|TM|r|tm)\)|@.*", " ", cpu).split()
    return " ".join(w for w in words if w.lower() not in ("cpu", "processor")) or "CPU"


def machine_toml(f: Fit, host: dict, date: str, dtype: str, name: str = "local") -> str:
    n = host["nproc"]
    where = (f"measured on {host['cpu']} ({host['logical_cpus']} logical CPUs, {host['memory_bytes'] / 1e9:.0f} GB), "
             f"{n} gloo ranks, {dtype}, compute nice +{host.get('compute_nice', 0)}, by twin calibrate on {date}"
             + (f", the median of {host['launches']} launches" if host.get("launches", 1) > 1 else ""))

    def num(value: float, what: str, digits: int = 6) -> str:
        shown = int(value) if float(value).is_integer() and abs(value) < 1e6 else float(f"{value:.{digits}g}")
        return f'{{ value = {shown!r}, source = "{where}: {what}" }}'

    def est(value: float, why: str) -> str:
        return f'{{ value = {value!r}, estimate = "{why}" }}'

    empirical = f.gemm_flop_per_s / 1e12
    lines = [
        f"# This host as a machine: {n} processes (ranks) are its 'devices', joined by gloo over",
        "# loopback through one switch vertex. Written by `twin calibrate`; the measurements and the",
        f"# simulator's predictions from this file are in {name}.calibration.json beside it.",
        "# Key style as the other machine files: units in key names, every number with source/estimate.",
        "",
        "[machine]",
        f'name = "{name}"',
        f'description = "this host: {n} executor ranks on {host["cpu"]} ({host["logical_cpus"]} logical CPUs), calibrated {date}"',
        "",
        "[device]",
        f'name = "{_short_cpu(host["cpu"])}, 1/{n} host"',
        f"peak_bf16_tflop_per_s = {est(float(f'{empirical:.6g}'), 'no advertised peak for a share of a CPU: set to the measured GEMM rate')}",
        f"empirical_gemm_bf16_tflop_per_s = {num(empirical, f'GEMM rate fitted over {len(GEMM_SHAPES)} shapes x 3 layouts, {dtype} (the executor element type)')}",
        f"hbm_gb = {num(host['memory_bytes'] / n / 1e9, f'host memory / {n} ranks (/proc/meminfo)')}",
        f"hbm_bw_gb_per_s = {num(f.hbm_bw_bytes_per_s / 1e9, 'copy bandwidth (read + write) fitted over element-wise ops 4 KB..64 MB, all ranks at once')}",
        f"compute_units = {est(1, 'one process runs one kernel at a time: no wave quantization')}",
        f"gemm_tile_m = {num(f.gemm_tile_m, 'fitted (grid search) to the GEMM times')}",
        f"gemm_tile_n = {num(f.gemm_tile_n, 'fitted (grid search) to the GEMM times')}",
        f"gemm_k_half = {num(f.gemm_k_half, 'fitted (grid search) to the GEMM times')}",
        f"layout_penalty_min_dim = {est(0, 'layout efficiencies apply to every GEMM')}",
        f"attention_efficiency = {num(min(f.attention_efficiency, 1.0), 'SDPA forward and backward rate fitted over the attention shapes, over the GEMM rate')}",
        f"hbm_efficiency = {est(1.0, 'hbm_bw_gb_per_s is the achieved copy bandwidth already')}",
        f"comm_compute_slowdown = {num(f.comm_compute_slowdown, '1 - GEMM time alone / GEMM time under a 64 MB all-reduce of all ranks: the share of its rate compute loses while a collective moves bytes')}",
        f"kernel_overhead_us = {num(f.kernel_overhead_s * 1e6, 'per-op fixed time (dispatch, launch) fitted jointly over GEMM, element-wise and attention')}",
        f"attention_overhead_us = {num(f.attention_overhead_s * 1e6, 'fixed time per attention call beyond kernel_overhead_us, fitted with attention_efficiency')}",
        "",
        "[device.layout_efficiency]",
    ]
    for lay in ("NN", "NT", "TN"):
        lines.append(f"{lay.lower()} = {num(min(f.layout_efficiency[lay], 1.0), f'{lay} rate fitted over the GEMM shapes / the fastest layout')}")
    lines += [
        "",
        "[node]",
        f"gpus_per_node = {num(n, 'the number of ranks calibrated')}",
        f"shared_cores = {num(host['logical_cpus'], 'logical CPUs (os.cpu_count) the ranks share: the rates above are those of every rank computing at once')}",
        f"comm_stretch_under_compute = {num(f.comm_stretch_under_compute, 'a 64 MB all-reduce of every rank while every rank runs GEMMs / the same all-reduce alone (at least 1): the collectives above run this many times longer while computing ranks hold every core')}",
        *([f"comm_latency_pace_under_compute = {num(f.comm_latency_pace_under_compute, 'of a 4 KB all-reduce of every rank issued before every rank runs GEMMs and waited for after: its time alone that went by during the GEMMs per second of them (0: it waited for them to end); the simulator moves a transfer bytes first and lets its latency go at this pace while its ranks compute and computing ranks hold every core')}"]
          if f.comm_latency_pace_under_compute is not None else []),
        f"timeslice_skew = {num(f.timeslice_skew, 'slope of a 4-byte all-reduce of every rank over the GEMM before it (4 sizes): the last rank lags the mean by this per second of compute while the ranks hold every core; ' + ('the collectives above have that lag behind their lead GEMM taken out' if f.lead_skew_s else 'the collectives above ran after a synchronisation, without it'))}",
        *([f"timeslice_lag_us = {num(f.timeslice_lag_s * 1e6, 'the same line at no GEMM less a 4 KB all-reduce of every rank right after a synchronisation: the lag that does not grow with the compute, once ranks holding every core have computed timeslice_lag_after_us')}",
           f"timeslice_lag_after_us = {num(f.timeslice_lag_after_s * 1e6, 'the shortest GEMM before the all-reduce (linearly from no lag below it)')}"]
          if f.timeslice_lag_s > 0 else []),
        *([f"timeslice_lag_span_us = {num(f.timeslice_lag_span_s * 1e6, 'the longest GEMM before the all-reduce: the range of the line above, which the simulator does not extrapolate')}",
           f"timeslice_skew_beyond_span = {num(f.timeslice_skew_beyond_span, 'from the line at timeslice_lag_span_us, the least-squares slope of the all-reduce after phases of 2, 4 and 8 of that GEMM over their compute: the lag per second of a longer phase past the span')}"
           if f.timeslice_skew_beyond_span is not None else
           f"timeslice_skew_beyond_span = {est(0.0, 'not measured (a calibration saved before 2026-12-07 ran no longer phases): the lag is held at its value at timeslice_lag_span_us')}"]
          if f.timeslice_lag_span_s > 0 and (f.timeslice_skew > 0 or f.timeslice_lag_s > 0) else []),
        (f"comm_core_share = {num(f.comm_core_share, 'half the ranks GEMMs while the other half runs 64 KB all-reduces in pairs, back to back, over the same GEMMs while it waits: the share of a core each rank moving bytes takes from the computing ranks (the simulator counts it in their load while it computes nothing)')}"
         if f.comm_core_share is not None else
         f"comm_core_share = {est(0.0, 'not measured (it needs 4k ranks, half of them holding every core): a rank moving bytes is taken to leave the computing ranks their cores')}"),
        "",
        "# gloo over loopback: every rank has one port of the measured bandwidth to a switch vertex.",
        "[node.switch]",
        'kind = "loopback"',
        f"links_per_gpu = {est(1, 'one TCP loopback path per rank')}",
        f"bw_per_direction_gb_per_s = {num(f.port_bw_bytes_per_s / 1e9, 'per-rank bandwidth fitted to all_reduce/all_gather/reduce_scatter times (ring traffic model), groups of 2..N')}",
        "",
        "[[node.nics]]",
        "index = 0",
        "attach_gpu = 0",
        f"bw_per_direction_gb_per_s = {est(1.0, 'unused: one host, no traffic leaves it')}",
        f"attach_bw_per_direction_gb_per_s = {est(1.0, 'unused: one host, no traffic leaves it')}",
        'estimate = "a placeholder NIC: the fat_tree network needs one; one host never uses it"',
        "",
        "[node.link_efficiency]",
        f"loopback = {est(1.0, 'the port bandwidth is the achieved one already')}",
        f"nic = {est(1.0, 'unused: one host')}",
        f"attach = {est(1.0, 'unused: one host')}",
        "",
        "[network]",
        'kind = "fat_tree"',
        f"nodes_per_leaf_group = {est(1, 'one host')}",
        f"n_nodes = {est(1, 'one host')}",
        f"link_bw_per_direction_gb_per_s = {est(1.0, 'unused: one host')}",
        f"oversubscription = {est(1.0, 'unused: one host')}",
        "",
        "# NCCL's tuning model with one protocol; fitted to gloo (ring latency = base + steps x hop).",
        "[collectives.protocols]",
        'allowed = ["simple"]',
        'estimate = "gloo has no LL/LL128 protocols: one protocol carries the fitted latency and bandwidth"',
        "",
        "[collectives.base_latency_us.ring]",
        f"simple = {num(f.base_latency_s * 1e6, 'fitted base latency of a collective')}",
        "",
        "[collectives.base_latency_us.tree]",
        f"simple = {num(f.base_latency_s * 1e6, 'as ring (trees need two nodes: unused on one host)')}",
        "",
        "[collectives.intra_hop_latency_us]",
        f"simple = {num(f.hop_latency_s * 1e6, 'fitted latency per ring step')}",
        "",
        "[collectives.inter_hop_latency_us]",
        f"simple = {num(f.hop_latency_s * 1e6, 'as intra-host (unused on one host)')}",
        "",
        "[collectives.protocol_bw_fraction]",
        f"simple = {est(1.0, 'the fitted port bandwidth is the achieved one')}",
        "",
    ]
    if f.p2p_latency_s is not None:
        lines += ["[collectives.p2p_latency_us]",
                  f"simple = {num(f.p2p_latency_s * 1e6, 'a send of 1-256 KB from one rank of each pair to the other, both ready, less its bytes at the port bandwidth: one message, not a ring')}",
                  ""]
    if f.kind_latency_s:
        lines.append("[collectives.kind_latency_us]")
        lines += [f"{k} = {num(v * 1e6, 'fitted base latency of this kind above base_latency_us')}" for k, v in f.kind_latency_s.items()]
        lines.append("")
    if f.kind_bw_fraction:
        lines.append("[collectives.kind_bw_fraction]")
        lines += [f"{k} = {num(min(v, 1.0), 'fitted bandwidth of this kind / the port bandwidth (the fastest kind)')}"
                  for k, v in f.kind_bw_fraction.items()]
        lines.append("")
    return "\n".join(lines)


def check_with_simulator(machine_path: str, samples: list[Sample], lead_skew_s: float = 0.0) -> list[dict]:
    """What twin.sim's own models predict, from the written file, for each microbenchmark; a collective
    behind its lead GEMM also waits `lead_skew_s` for the last rank (Fit.lead_skew_s)."""
    from topologies.fabric import Fabric
    from topologies.machine import load_machine
    from twin.sim.collectives import CollectiveModel
    from twin.sim.compute import ComputeModel

    machine = load_machine(machine_path)
    compute = ComputeModel(machine.device)
    n = machine.node.gpus_per_node
    collectives = CollectiveModel(Fabric(machine, n))
    rows = []
    for s in samples:
        p = s.params
        if s.kind == "gemm":
            pred = compute.duration_s(Gemm(p["m"], p["n"], p["k"], p["layout"], DTYPE))
        elif s.kind == "elementwise":
            pred = compute.duration_s(Elementwise(p["nbytes"]))
        elif s.kind == "attention":
            pred = compute.duration_s(Attention(p["batch"], p["seq"], p["heads"], p["head_dim"], p["backward"], True, DTYPE))
        elif s.kind == "collective":
            gpus = tuple(range(p["group_size"]))
            lowering, protocol = collectives.choose(gpus, p["kind"], p["nbytes"])
            pred = collectives.time_alone_s(lowering, protocol, p["nbytes"]) + lead_skew_s
        elif s.kind == "p2p":
            pred = collectives.time_alone_s(collectives.transfer(0, 1), machine.collectives.protocols[0], p["nbytes"])
        else:
            continue
        rows.append({"kind": s.kind, **p, "measured_s": s.time_s, "simulated_s": pred,
                     "error": (pred - s.time_s) / s.time_s})
    return rows


def write_machine(path: str, f: Fit, samples: list[Sample], host: dict, dtype: str, date: str | None = None,
                  launch_samples: list[list[Sample]] | None = None, spread: dict | None = None) -> dict:
    """Write the machine file and NAME.calibration.json beside it; return the JSON document. `launch_samples`:
    each launch's samples where `samples` combine several (kept so that they can be combined again); `spread`:
    each number's range over the launches fitted alone (executor.calibrate_host.launch_spread)."""
    date = date or datetime.date.today().isoformat()
    name = os.path.basename(path).removesuffix(".toml")
    text = machine_toml(f, host, date, dtype, name)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as out:
        out.write(text)
    os.replace(tmp, path)
    checks = check_with_simulator(path, samples, f.lead_skew_s)
    summary = {}
    for kind in sorted({c["kind"] for c in checks}):
        rows = [c for c in checks if c["kind"] == kind]
        errs = [abs(c["error"]) for c in rows]
        # the file's time over the microbenchmarks' summed, less 1: a bias the median |error| does not show
        total = sum(c["simulated_s"] for c in rows) / sum(c["measured_s"] for c in rows) - 1
        summary[kind] = {"samples": len(errs), "median_abs_error": float(np.median(errs)), "max_abs_error": float(max(errs)),
                         "total_time_error": float(total)}
    doc = {"host": host, "date": date, "dtype": dtype, "fit": asdict(f), "simulator_vs_measured": summary,
           "samples": [asdict(s) for s in samples], "predictions": checks}
    if spread:
        doc["launch_spread"] = spread
    if launch_samples:
        doc["launch_samples"] = [[asdict(s) for s in launch] for launch in launch_samples]
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), f"{name}.calibration.json")
    tmp = f"{beside}.tmp{os.getpid()}"  # whole or not at all: `twin calibrate --refit` may read and write one file
    with open(tmp, "w") as out:
        json.dump(doc, out, indent=1)
    os.replace(tmp, beside)
    return doc
