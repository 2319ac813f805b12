"""Frontier's published rows with RCCL's NIC efficiency by kind of collective, as the two measurements give it.

    .venv/bin/python benchmarks/nic_by_kind.py [--json]      # 3.8 min cold (six validations), seconds warm

frontier.toml's NIC efficiency (0.41) comes from AxoNN's measured RCCL
all-reduces and times every collective across nodes. The PCCL reproducer
measured RCCL's all-gathers and reduce-scatters across the same NICs at about
twice that rate (benchmarks/collectives_at_scale.py). This takes each kind's
bandwidth from its own measurement: the all-reduce's stays the file's, the
all-gather's and the reduce-scatter's are the PCCL fits' node bandwidths
(twin.collectives_at_scale.fit_latency_bandwidth, computed here) over the
node's NIC peak, written as `[collectives.nic_efficiency]` into copies of
frontier.toml and topologies/fitted/frontier.toml. It then runs `twin
validate` three ways, first principles and calibrated: the files as they
are, each kind at its own measured rate, and the all-reduce too at the
all-gather's (the forty-first session's what-if, `--set
node.link_efficiency.nic=0.797`, but for point-to-point transfers, which that
also sped). A what-if: plans are searched again on each file; nothing here
changes a machine file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies import load_machine  # noqa: E402
from twin.collectives_at_scale import fit_latency_bandwidth, load_table  # noqa: E402
from twin.validate import calibrated_files, validate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("all_gather", "reduce_scatter")  # the kinds the PCCL table measured on Frontier


def measured_efficiencies() -> dict[str, dict]:
    """Per kind the PCCL fit's node bandwidth and its share of a Frontier node's NIC peak."""
    machine = load_machine("frontier")
    peak = sum(nic.bw_bytes_per_s for nic in machine.node.nics)
    out = {}
    for kind in KINDS:
        fit, _ = fit_latency_bandwidth([e for e in load_table() if e.machine == "frontier" and e.collective == kind])
        out[kind] = {"measured": kind, "node_gb_per_s": fit.node_bytes_per_s / 1e9,
                     "efficiency": round(fit.node_bytes_per_s / peak, 3)}
    return out


def with_table(source: Path, efficiencies: dict[str, dict], folder: Path) -> str:
    """A copy of `source` with `[collectives.nic_efficiency]` from `efficiencies` (kind -> the measurement it takes:
    its own, or another kind's); its path."""
    lines = ["", "[collectives.nic_efficiency]"]
    for kind, e in efficiencies.items():
        lines.append(f'{kind} = {{ value = {e["efficiency"]}, estimate = "benchmarks/nic_by_kind.py: the PCCL '
                     f'reproducer\'s RCCL {e["measured"]}s, {e["node_gb_per_s"]:.1f} GB/s a node fitted" }}')
    path = folder / f"{source.parent.name}-{source.name}"
    path.write_text(source.read_text() + "\n".join(lines) + "\n")
    return str(path)


def variants(folder: Path, efficiencies: dict[str, dict]) -> dict[str, dict]:
    """validate()'s keyword arguments for each way of timing the collectives: the files as they are; each kind
    at its own measured rate; every kind (the all-reduce too) at the all-gather's."""
    every = {kind: efficiencies["all_gather"] for kind in ("all_reduce",) + KINDS}
    fitted, out = calibrated_files(), {"files as they are": {}}
    for name, table in (("each kind its own", efficiencies), ("every kind the all-gather's", every)):
        sub = folder / name.split()[0]
        sub.mkdir()
        out[name] = {"files": {"frontier": with_table(ROOT / "topologies" / "frontier.toml", table, sub)},
                     "fitted_files": fitted | {"frontier": with_table(Path(fitted["frontier"]), table, sub)}}
    return out


def run_variant(name: str, kwargs: dict, say) -> dict:
    """First principles and calibrated rows of one variant."""
    v = validate(progress=say, calibrated=True, **kwargs)
    rows = [{"quantity": r.quantity, "plan": r.plan, "predicted": r.predicted, "error": r.error,
             "calibrated": r.calibrated, "calibrated_error": r.calibrated_error} for r in v.rows]
    return {"variant": name, "rows": rows, "mean": v.mean_abs_error, "max": v.max_abs_error,
            "calibrated_mean": v.calibrated_mean_abs_error, "calibrated_max": v.calibrated_max_abs_error}


def _percent(x) -> str:
    return "" if not isinstance(x, (int, float)) else f"{x * 100:+.0f}%"


def print_table(efficiencies: dict[str, dict], results: list[dict]) -> None:
    for kind, e in efficiencies.items():
        print(f"{kind}: PCCL's fit {e['node_gb_per_s']:.1f} GB/s a node -> nic_efficiency {e['efficiency']}")
    print(f"all_reduce: the file's node.link_efficiency.nic {load_machine('frontier').node.link_efficiency['nic']}")
    names = [r["variant"] for r in results]
    print(f"\n{'row (error: first principles / calibrated)':52s}" + "".join(f"{n:>30s}" for n in names))
    for i, row in enumerate(results[0]["rows"]):
        cells = [(r["rows"][i]["error"], r["rows"][i]["calibrated_error"]) for r in results]
        if not any(isinstance(x, (int, float)) for pair in cells for x in pair):
            continue  # ranges and bounds: their errors are words
        print(f"{row['quantity'][:52]:52s}" + "".join(f"{_percent(a):>15s}{_percent(b):>15s}" for a, b in cells))
    for label, key in (("mean |error|", "mean"), ("max |error|", "max")):
        print(f"{label:52s}" + "".join(f"{r[key] * 100:>14.1f}%{r['calibrated_' + key] * 100:>14.1f}%"
                                        for r in results))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print every variant's rows and means as JSON")
    args = ap.parse_args(argv)
    efficiencies = measured_efficiencies()
    say = lambda what: print(f"  {what} ...", file=sys.stderr)  # noqa: E731
    with tempfile.TemporaryDirectory() as folder:
        results = [run_variant(name, kwargs, say) for name, kwargs in variants(Path(folder), efficiencies).items()]
    result = {"efficiencies": efficiencies, "variants": results}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(efficiencies, results)
    return result


if __name__ == "__main__":
    main()
