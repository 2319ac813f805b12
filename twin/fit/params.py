"""The machine-file numbers `twin fit` may learn, each physically named and bounded.

Only numbers with a physical meaning that measured steps can pin down, and
that no datasheet gives to the precision a prediction needs: the host's time
per op issued (on small models the framework, not the GPU, sets the pace), a
fixed device cost per kernel (launch and tail), the empirical GEMM rate and how short inner
dimensions and a last wave of tiles lower it, the HBM efficiency of element-wise work, the fused
attention kernel's rate, and where the machine file gives one the FP8 GEMM rate (from runs whose plans
run their linears in FP8; never by default). No per-row or per-model factor exists, so a fit
cannot memorise the runs it learns from.

Bounds are physical, not tuning ranges: a host issues an op in 1-500 us; a
kernel costs between half a microsecond and 200 us of launch and tail; a GEMM cannot beat the device's
peak nor run below a fifth of the file's empirical rate; efficiencies are
fractions.

Each level of the machine's links (`[node.link_efficiency]`: NVLink or
xGMI inside a node, the PCIe attach, the NIC, the network between switches)
has its achieved fraction of peak fittable too: what the collective library
reaches there, which a datasheet does not say. A level no measured run's
critical path crosses has no effect and cannot be fitted (a one-node file
fits no NIC); without --params they are fitted only where a run spans nodes.

A fit that ends on a bound is refused (twin.fit.solve): the runs ask for
something the model cannot be, and the fit would be hiding it.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.machine import Machine
from twin.errors import TwinError


@dataclass(frozen=True)
class FitParameter:
    """A machine-file number (its dotted path, in the file's units) and its bounds."""

    path: str
    lower: float
    upper: float
    meaning: str
    start: float = 0.0  # where a fit starts when the machine file lacks the number (an optional key) or has 0


def _parameters(machine: Machine) -> dict[str, FitParameter]:
    """Every fittable number of `machine`, with bounds that may depend on the machine's own numbers."""
    dev = machine.device
    empirical_tf = dev.empirical_gemm_flop_per_s / 1e12
    return {p.path: p for p in (
        FitParameter("device.launch_interval_us", 1.0, 500.0, "host time per op the framework issues", start=10.0),
        FitParameter("device.kernel_overhead_us", 0.5, 200.0, "fixed device time per kernel: launch and tail"),
        FitParameter("device.empirical_gemm_bf16_tflop_per_s", empirical_tf / 5, dev.peak_flop_per_s / 1e12,
                     "GEMM rate at large shapes"),
        FitParameter("device.gemm_k_half", 1.0, 4096.0, "inner dimension at which the k loop halves a GEMM's rate"),
        FitParameter("device.gemm_wave_quantization", 0.01, 1.0,
                     "share of the last wave's idle units a GEMM pays (1: grids of fixed tiles; 0: persistent kernels)",
                     start=1.0),
        FitParameter("device.hbm_efficiency", 0.1, 1.0, "achieved / peak HBM bandwidth of element-wise work"),
        FitParameter("device.attention_efficiency", 0.05, 1.0, "fused attention rate / empirical GEMM rate"),
    ) + ((  # the FP8 GEMM rate, where the file gives one: runs with fp8=1 plans pin it down
        FitParameter("device.empirical_gemm_fp8_tflop_per_s", dev.empirical_gemm_fp8_flop_per_s / 5e12,
                     dev.peak_fp8_flop_per_s / 1e12, "FP8 GEMM rate at large shapes (fp8=1 plans' linears)"),
    ) if dev.empirical_gemm_fp8_flop_per_s else ()) + tuple(
        FitParameter(path, 0.02, 1.0, f"achieved / peak bandwidth of {path.rsplit('.', 1)[1]} links: the collective "
                     "library's reach at that level")
        for path in link_parameters(machine))}


DEFAULT_PARAMETERS = (
    "device.launch_interval_us", "device.kernel_overhead_us", "device.empirical_gemm_bf16_tflop_per_s", "device.gemm_k_half",
    "device.hbm_efficiency", "device.attention_efficiency",
)


def link_parameters(machine: Machine) -> tuple[str, ...]:
    """The achieved fraction of each of the machine's link levels, as fittable paths."""
    return tuple(f"node.link_efficiency.{kind}" for kind in machine.node.link_efficiency)


def default_parameters(machine: Machine, run_gpus: list[int]) -> tuple[str, ...]:
    """What `twin fit` fits when --params is not given: the device's numbers, and every link level's achieved
    bandwidth only where some run spans nodes (the levels no run's path crosses are then left out)."""
    spans_nodes = any(gpus > machine.node.gpus_per_node for gpus in run_gpus)
    return DEFAULT_PARAMETERS + (link_parameters(machine) if spans_nodes else ())


def fit_parameters(machine: Machine, names: tuple[str, ...] = DEFAULT_PARAMETERS) -> tuple[FitParameter, ...]:
    """The FitParameters named, in order; a one-line error for an unknown or repeated name."""
    known = _parameters(machine)
    out = []
    for name in names:
        if name not in known:
            raise TwinError(f"--params: {name!r} cannot be fitted; fittable: {', '.join(known)}")
        if known[name] in out:
            raise TwinError(f"--params: {name} is given twice; give it once")
        out.append(known[name])
    if not out:
        raise TwinError("--params: name at least one parameter to fit")
    return tuple(out)


def file_value(machine: Machine, param: FitParameter) -> float:
    """The parameter's value in the machine file (after any --set), in the file's units; its `start` where the
    file lacks it or has 0 (a log-parameter fit cannot start at 0)."""
    s = machine.sources.get(param.path)
    return s.value if s is not None and s.value > 0 else param.start
