"""What `twin calibrate` prints of a fit: the fitted numbers, each launch's range, and how the written file
reproduces the microbenchmarks (for a person; --json prints the calibration document instead)."""

from __future__ import annotations

from executor.calibrate import Fit

# The numbers whose range over the launches, each fitted alone, a calibration reports: (label, Fit field, unit
# scale, unit); executor.calibrate_host.launch_spread
SPREAD_FIELDS = (("GEMM", "gemm_flop_per_s", 1e-9, "GF/s"), ("copy", "hbm_bw_bytes_per_s", 1e-9, "GB/s"),
                 ("attention efficiency", "attention_efficiency", 1.0, ""),
                 ("collective bandwidth", "port_bw_bytes_per_s", 1e-9, "GB/s"),
                 ("base latency", "base_latency_s", 1e6, "us"), ("hop latency", "hop_latency_s", 1e6, "us"),
                 ("point-to-point latency", "p2p_latency_s", 1e6, "us"),
                 ("lag per second of compute", "timeslice_skew", 1.0, ""), ("lag floor", "timeslice_lag_s", 1e6, "us"),
                 ("stretch under compute", "comm_stretch_under_compute", 1.0, ""),
                 ("core share", "comm_core_share", 1.0, ""), ("comm/compute slowdown", "comm_compute_slowdown", 1.0, ""))


def format_spread(spread: dict[str, list[float]]) -> str:
    """launch_spread for a person: "GEMM 51-57.8 GF/s, ..." (whole numbers from 100 up)."""
    units = {label: unit for label, _, _, unit in SPREAD_FIELDS}

    def number(x: float) -> str:
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"

    return ", ".join(f"{label} {number(lo)}-{number(hi)}" + (f" {units[label]}" if units.get(label) else "")
                     for label, (lo, hi) in spread.items())


def oversubscribed(host: dict) -> bool:
    """At least as many ranks as the host's logical CPUs: where the simulator applies the time-slicing lag
    (ranks computing on every core drift apart: twin.sim.compute_unit.NodeCores)."""
    return host["nproc"] >= host["logical_cpus"]


def fit_lines(f: Fit, doc: dict) -> list[str]:
    """The fitted numbers and how the written file reproduces the microbenchmarks, one line each."""
    layouts = " ".join(f"{k} {f.layout_efficiency[k]:.2f}" for k in ("NN", "NT", "TN"))
    lines = [f"  GEMM {f.gemm_flop_per_s / 1e9:.1f} GF/s per rank (tiles {f.gemm_tile_m}x{f.gemm_tile_n}, "
             f"k_half {f.gemm_k_half:g}; layouts {layouts})",
             f"  copy {f.hbm_bw_bytes_per_s / 1e9:.2f} GB/s, kernel overhead {f.kernel_overhead_s * 1e6:.1f} us, "
             f"attention efficiency {f.attention_efficiency:.2f} + {f.attention_overhead_s * 1e6:.0f} us per call, "
             f"comm/compute slowdown {f.comm_compute_slowdown:.2f}",
             f"  a collective while every rank computes: x{f.comm_stretch_under_compute:.2f} its time alone"
             + (f"; a small one's latency at {f.comm_latency_pace_under_compute:.2f} of its pace alone"
                if f.comm_latency_pace_under_compute is not None else ""),
             f"  time-slicing: the last rank lags {100 * f.timeslice_skew:.1f}% of the compute before a "
             "synchronisation"
             + (f" plus {f.timeslice_lag_s * 1e6:.0f} us after {f.timeslice_lag_after_s * 1e6:.0f} us of it"
                if f.timeslice_lag_s else "")
             + (f", {100 * f.timeslice_skew_beyond_span:.1f}% past {f.timeslice_lag_span_s * 1e3:.1f} ms of it"
                if f.timeslice_lag_span_s and f.timeslice_skew_beyond_span is not None
                else f", held past {f.timeslice_lag_span_s * 1e3:.1f} ms of it" if f.timeslice_lag_span_s else "")
             + (f" (taken out of each collective, each after a GEMM: {f.lead_skew_s * 1e6:.0f} us)" if f.lead_skew_s
                else " (unused: fewer ranks than cores)" if f.timeslice_skew and not oversubscribed(doc["host"])
                else "")]
    if f.comm_core_share is not None:
        lines.append(f"  a rank moving bytes takes {f.comm_core_share:.2f} of a core from the ranks computing beside it")
    kinds = ", ".join(f"{k} +{f.kind_latency_s.get(k, 0) * 1e6:.0f} us x{v:.2f} bandwidth"
                      for k, v in f.kind_bw_fraction.items())
    lines.append(f"  collectives: {f.port_bw_bytes_per_s / 1e9:.3f} GB/s per rank, latency {f.base_latency_s * 1e6:.0f} "
                 f"us + {f.hop_latency_s * 1e6:.0f} us per ring step; per kind {kinds}")
    if f.p2p_latency_s is not None:
        lines.append(f"  point-to-point: latency {f.p2p_latency_s * 1e6:.0f} us (one message, not a ring's base and hop)")
    if doc.get("launch_spread"):
        lines.append(f"  each launch fitted alone (the file fits their median): {format_spread(doc['launch_spread'])}")
    lines.append("  the simulator on this file vs the microbenchmarks (median |error|; error of their summed time):")
    for kind, row in doc["simulator_vs_measured"].items():
        lines.append(f"    {kind:<16}{100 * row['median_abs_error']:6.1f}%  {100 * row['total_time_error']:+6.1f}%  "
                     f"({row['samples']} points)")
    return lines
