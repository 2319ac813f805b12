"""Measure one node, predict the cluster: the fit protocol on A100 and H100 runs, in one table.

    .venv/bin/python benchmarks/fit_accuracy.py [--json] [--jobs N] [--fitted out/a100-fitted.toml]
        [--carried out/dgx-a100-carried.toml] [--mpt-out out] [--figure PNG]

1. `twin fit` on the single-node calibration file (1,440 runs on 2-8 A100s of
   one node) from topologies/dgx-a100-800g.toml, with the assumptions and the
   parameters below (as `make fit`), writing the fitted machine file;
2. the single-node runs: the file's error, the fitted (in-sample) error and
   the 5-fold cross-validated error;
3. the multi-node validation file (88 runs, 64-512 GPUs; never fitted): each
   run predicted with the first-principles file and with the fitted one, the
   mean and max absolute error, and within each model size whether the twin
   orders the plans as measured (Spearman's rank correlation);
4. a second cluster and code, never fitted either: Megatron-LM's published
   runs on Selene, the ten weak-scaling runs of 2021 (Narayanan et al. SC'21
   Table 1, 1.7B-1T on 32-3,072 A100s) and the eight of 2022 with and without
   sequence parallelism and selective recompute (Korthikanti et al. MLSys'23
   Table 5, 22B-1T on 8-512 A100s), predicted with topologies/dgx-a100.toml as
   it is and with the host interval fitted in step 1 carried to it (as `make
   fit` carries it to Perlmutter: another code on another host, so a
   transfer, not a fit);
5. a third cluster and code: MosaicML's MPT runs on A100 40 GB (PyTorch
   FSDP, flash attention, bf16; llm-foundry's benchmarking table), fitted on
   its 46 one-node runs (the attention and GEMM rates, as `make fit`) and
   predicting its 32 runs on 16-128 GPUs, never fitted; a run the twin's
   memory model refuses is counted as not predicted; and the same code's 61
   runs on A100 80 GB (dgx-a100, with the two rates carried to it);
6. the same code on H100 80 GB (llm-foundry's H100 tables of October 2023 and
   January 2024): fitted on its 37 one-node runs, predicting its 33 runs on
   16-512 GPUs, never fitted.

Prints the targets of the fit issue beside what was measured, with the ratio.
Data: benchmarks/data/README.md (vTrain, Bang et al., MICRO'24; Narayanan et al., SC'21; Korthikanti et al.,
MLSys'23; mosaicml/llm-foundry).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.cli.runs import error_stats, spearman_by_label  # noqa: E402
from twin.fit.machinefile import write_fitted  # noqa: E402
from twin.fit.params import fit_parameters  # noqa: E402
from twin.fit.solve import fit, simulate_runs  # noqa: E402
from twin.search.rank import worker_count  # noqa: E402
from twin.figures import measured_vs_predicted_figure  # noqa: E402
from twin.runs import load_runs  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
CALIBRATION = DATA / "a100-megatron-single-node.csv"
VALIDATION = DATA / "a100-megatron-multi-node.csv"
MACHINE = "dgx-a100-800g"
SELENE_MACHINE = "dgx-a100"
# What vTrain's configuration files do not state, chosen once (benchmarks/data/README.md): Megatron-DeepSpeed
# of 2021-22 ran unfused core attention in fp16 with full activation recompute; the optimizer step is DeepSpeed's
# fused fp16 one, which the calibration runs' per-step fixed cost points to (benchmarks/step_intercepts.py,
# docs/fit.md), not Megatron's, which streams nearly twice the bytes.
ASSUME = "attention=unfused,recompute=full,dtype=fp16,optimizer=flat"
# As `make fit`: the number these runs pin down inside its bounds (docs/fit.md: the others end on a bound).
PARAMS = ("device.launch_interval_us",)
# Megatron-LM's published runs on Selene (benchmarks/data/README.md), each set with what its authors ran: core
# attention (both predate FlashAttention), fp16 and Megatron's own optimizer (the plan's default); full recompute
# in 2021, and in 2022 each row's plan names its recompute and sequence parallelism. (JSON key, file, assumptions,
# panel title with {n} for the number of runs.)
SELENE_SETS = (
    ("selene", DATA / "megatron-sc21-table1.csv", "attention=unfused,recompute=full,dtype=fp16",
     "Selene 2021, 32-3072 GPUs: Megatron-LM's {n} published runs"),
    ("selene_2022", DATA / "megatron-korthikanti-table5.csv", "attention=unfused,dtype=fp16",
     "Selene 2022, 8-512 GPUs: {n} runs, full and selective recompute"),
)
# MosaicML's MPT runs (benchmarks/data/README.md): what the runs do not say (MPT trains without dropout), the
# numbers each cluster's one-node runs pin down (as `make fit`), and per cluster: JSON key, GPU, calibration file,
# machine, and its validation sets (JSON key, file, the machine the fit is carried to or None for the cluster's
# own, panel title with {n} for the number of runs predicted).
MPT_ASSUME = "dropout=0"
MPT_PARAMS = ("device.attention_efficiency", "device.empirical_gemm_bf16_tflop_per_s")
MPT_CLUSTERS = (
    ("mpt", "A100 40 GB", DATA / "mpt-a100-40gb-one-node.csv", "mpt-a100-40g", (
        ("mpt_multi_node", DATA / "mpt-a100-40gb-multi-node.csv", None,
         "MosaicML MPT, 16-128 A100 40 GB: {n} runs, fitted on its one node"),
        # the same code on A100 80 GB (dgx-a100), mostly one node: a transfer
        ("mpt_80gb", DATA / "mpt-a100-80gb.csv", SELENE_MACHINE,
         "MosaicML MPT, A100 80 GB: {n} runs, the 40 GB fit carried"))),
    ("mpt_h100", "H100 80 GB", DATA / "mpt-h100-80gb-one-node.csv", "mpt-h100-80g", (
        ("mpt_h100_multi_node", DATA / "mpt-h100-80gb-multi-node.csv", None,
         "MosaicML MPT, 16-512 H100 80 GB: {n} runs, fitted on its one node"),)),
)
TARGETS = {  # the fit issue's targets: (what, target, lower is better)
    "multi_node_mean_abs_pct": ("A100 multi-node, fitted on one node: mean |error| %", 10.0),
    "min_spearman": ("A100 multi-node: Spearman within each model size (min)", 0.9),
    "single_node_cv_mean_abs_pct": ("single node: 5-fold cross-validated mean |error| %", 8.0),
    "fit_wall_s": ("twin fit on the 1,440 single-node runs: wall seconds", 120.0),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=worker_count(None))
    ap.add_argument("--fitted", default="out/a100-fitted.toml", help="where to write the fitted machine file")
    ap.add_argument("--carried", default="out/dgx-a100-carried.toml",
                    help="where to write Selene's machine file with the fitted numbers carried to it")
    ap.add_argument("--mpt-out", default="out",
                    help="folder for the machine files fitted on MosaicML's one-node runs (<machine>-fitted.toml) "
                         "and carried from them (<machine>-mpt-carried.toml)")
    ap.add_argument("--figure", default="figures/fit-one-node.png", help="predicted vs measured, every set (PNG)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    wall = time.perf_counter()
    base = load_machine(MACHINE)
    calibration = load_runs(str(CALIBRATION), ASSUME)
    t = time.perf_counter()
    result = fit(calibration, MACHINE, (), fit_parameters(base, PARAMS), folds=5, jobs=args.jobs,
                 say=lambda line: print(f"  {line}", file=sys.stderr))
    fit_s = time.perf_counter() - t
    Path(args.fitted).parent.mkdir(parents=True, exist_ok=True)

    _write(result, base.path, f"twin fit on {CALIBRATION.name} ({len(calibration)} runs, assuming {ASSUME}) by "
          "benchmarks/fit_accuracy.py", args.fitted)
    _write(result, load_machine(SELENE_MACHINE).path, f"carried from {Path(args.fitted).name} ({MACHINE}), fitted "
          f"there on {CALIBRATION.name} by benchmarks/fit_accuracy.py", args.carried)
    validation, columns = _predict(VALIDATION, ASSUME, (MACHINE, args.fitted), args.jobs)
    mpt = {key: _mpt_cluster(calibration_file, machine, sets, args.mpt_out, args.jobs)
           for key, _, calibration_file, machine, sets in MPT_CLUSTERS}
    selene = {key: _predict(path, assume, (SELENE_MACHINE, args.carried), args.jobs)
              for key, path, assume, _ in SELENE_SETS}
    single = np.array([r.step_time_s for r in calibration])
    measured_vs_predicted_figure(args.figure, [
        (f"one node: {len(calibration)} calibration runs", list(single),
         {"fitted (5-fold cross-validated)": list(single * (1 + result.cv_errors))}),
        _panel("64-512 GPUs: {n} validation runs, never fitted", validation, columns),
        *(_panel(title, *selene[key]) for key, _, _, title in SELENE_SETS),
        *(_panel(title, *mpt[key]["sets"][set_key]) for key, _, _, _, sets in MPT_CLUSTERS
          for set_key, _, _, title in sets),
    ], "Fitted on one node: vTrain's A100s predicting them and Selene (Megatron); MosaicML's A100 40 GB predicting "
       "them and its 80 GB runs, its H100s predicting them (FSDP, flash)")
    doc = {
        "fit": {"params": _params(result), "left_out": list(result.dropped), "passes": result.passes, "wall_s": fit_s,
                "single_node_file_subset": error_stats(result.errors_before),
                "single_node_fitted": error_stats(result.errors_after),
                "single_node_cv": error_stats(result.cv_errors)},
        "multi_node": columns,
        **{key: selene[key][1] for key, _, _, _ in SELENE_SETS},
        **{f"{key}_fit": mpt[key]["fit"] for key, *_ in MPT_CLUSTERS},
        **{set_key: mpt[key]["sets"][set_key][1] for key, _, _, _, sets in MPT_CLUSTERS for set_key, *_ in sets},
        "measured": {
            "multi_node_mean_abs_pct": columns["fitted"]["mean_abs_pct"],
            "min_spearman": min(columns["fitted"]["spearman_by_model"].values()),
            "single_node_cv_mean_abs_pct": 100 * float(np.abs(result.cv_errors).mean()),
            "fit_wall_s": fit_s,
        },
        "assume": ASSUME, **{f"{key}_assume": assume for key, _, assume, _ in SELENE_SETS}, "mpt_assume": MPT_ASSUME,
        "wall_s": time.perf_counter() - wall, "figure": args.figure,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return doc
    _print(doc, result, validation, {key: len(runs) for key, (runs, _) in selene.items()},
           {set_key: len(mpt[key]["sets"][set_key][0]) for key, _, _, _, sets in MPT_CLUSTERS
            for set_key, *_ in sets})
    return doc


def _mpt_cluster(calibration_file: Path, machine: str, sets: tuple, out: str, jobs: int) -> dict:
    """One MosaicML cluster: `twin fit` on its one-node runs (as `make fit`), the fitted file written to
    `out`/<machine>-fitted.toml (and carried to each set's other machine), and each validation set predicted with
    the first-principles file and the fitted or carried one."""
    runs = load_runs(str(calibration_file), MPT_ASSUME)
    result = fit(runs, machine, (), fit_parameters(load_machine(machine), MPT_PARAMS), folds=5, jobs=jobs)
    fitted = str(Path(out) / f"{machine}-fitted.toml")
    _write(result, load_machine(machine).path, f"twin fit on {calibration_file.name} ({len(runs)} runs, assuming "
          f"{MPT_ASSUME}) by benchmarks/fit_accuracy.py", fitted)
    predicted = {}
    for set_key, path, carried_to, _ in sets:
        pair = (machine, fitted)
        if carried_to is not None:
            carried = str(Path(out) / f"{carried_to}-mpt-carried.toml")
            _write(result, load_machine(carried_to).path, f"carried from {Path(fitted).name} ({machine}), fitted "
                  f"there on {calibration_file.name} by benchmarks/fit_accuracy.py", carried)
            pair = (carried_to, carried)
        predicted[set_key] = _predict(path, MPT_ASSUME, pair, jobs)
    return {"fit": {"params": _params(result), "one_node_file": error_stats(result.errors_before),
                    "one_node_fitted": error_stats(result.errors_after), "one_node_cv": error_stats(result.cv_errors),
                    "runs": len(runs), "file": calibration_file.name},
            "sets": predicted}


def _write(fitted, machine_path: str, provenance: str, out: str) -> None:
    """The numbers of the FitResult `fitted` into a copy of the machine file at `machine_path`, each with
    `provenance`."""
    write_fitted(machine_path, {p.path: (v, provenance) for p, v in zip(fitted.params, fitted.values)}, out)


def _params(result) -> dict:
    """Each fitted number of a FitResult: the file's value, the fitted one and its standard error."""
    return {p.path: {"file": s, "fitted": v, "std": e}
            for p, s, v, e in zip(result.params, result.start, result.values, result.std)}


def _panel(title: str, runs: list, columns: dict) -> tuple[str, list[float], dict[str, list[float]]]:
    """One figure panel of _predict's columns: the runs every column predicted ({n} in `title` counts them)."""
    kept = [i for i in range(len(runs)) if all(col["predicted_s"][i] is not None for col in columns.values())]
    return (title.format(n=len(kept)), [runs[i].step_time_s for i in kept],
            {name: [col["predicted_s"][i] for i in kept] for name, col in columns.items()})


def _predict(path: Path, assume: str, machines: tuple[str, str], jobs: int) -> tuple[list, dict]:
    """The runs of a validation file, each predicted with the first-principles machine file and the fitted one (or
    the one the fit was carried to): error statistics and, within each model size of at least three runs,
    Spearman's rank correlation between the measured and the predicted order. A run the twin refuses (twin validate
    --runs: its memory model says the plan cannot fit) is None in "predicted_s" and out of the statistics."""
    runs = load_runs(str(path), assume)
    measured = np.array([r.step_time_s for r in runs])
    columns = {}
    for name, machine in zip(("first principles", "fitted"), machines):
        refused: dict[int, str] = {}
        paths = simulate_runs(runs, machine, [()] * len(runs), jobs, refused=refused)
        kept = np.array([p is not None for p in paths])
        predicted = np.array([p.step_s for p in paths if p is not None])
        columns[name] = {**error_stats(predicted / measured[kept] - 1), "runs": int(kept.sum()),
                         "spearman_by_model": spearman_by_label([r for r, k in zip(runs, kept) if k],
                                                                measured[kept], predicted),
                         "predicted_s": [p.step_s if p is not None else None for p in paths],
                         "not_predicted": {runs[i].where: why for i, why in refused.items()}}
    return runs, columns


def _print(doc: dict, result, validation, selene_counts: dict[str, int], mpt_counts: dict[str, int]) -> None:
    f = doc["fit"]
    print(f"twin fit on {CALIBRATION.name} ({len(result.runs)} runs, assuming {ASSUME}): {f['passes']} passes, "
          f"{f['wall_s']:.0f} s")
    for path, p in f["params"].items():
        print(f"  {path:<42} {p['file']:>9.4g} -> {p['fitted']:>9.4g} ± {p['std']:.2g}")
    if f["left_out"]:
        print(f"  left out (no run depends on them): {', '.join(f['left_out'])}")
    for key, *_ in MPT_CLUSTERS:
        print(f"twin fit on {doc[key + '_fit']['file']} (assuming {MPT_ASSUME}):")
        for path, p in doc[key + "_fit"]["params"].items():
            print(f"  {path:<42} {p['file']:>9.4g} -> {p['fitted']:>9.4g} ± {p['std']:.2g}")
    print(f"\n{'runs':<50}{'column':<18}{'mean |e|':>9}{'mean e':>9}{'max |e|':>9}   Spearman by model size")
    rows = [("single node (first pass's runs)", "machine file", f["single_node_file_subset"], None),
            ("single node, 1,440 runs", "fitted", f["single_node_fitted"], None),
            ("single node, 1,440 runs", "5-fold CV", f["single_node_cv"], None)]
    for name, col in doc["multi_node"].items():
        rows.append((f"multi node, {len(validation)} runs (validation)", name, col, col["spearman_by_model"]))
    for key, path, _, _ in SELENE_SETS:
        for name, col in doc[key].items():
            rows.append((f"Selene: {path.stem}, {selene_counts[key]} runs", name, col, None))
    for key, gpu, _, _, sets in MPT_CLUSTERS:
        m = doc[key + "_fit"]
        rows += [(f"MPT one node, {m['runs']} runs ({gpu})", column, m[stat], None)
                 for column, stat in (("machine file", "one_node_file"), ("fitted", "one_node_fitted"),
                                      ("5-fold CV", "one_node_cv"))]
        for set_key, path, carried_to, _ in sets:
            what = f"MPT {path.stem.removeprefix('mpt-')}{', carried' if carried_to else ''}"
            rows += [(f"{what}, {col['runs']} of {mpt_counts[set_key]} runs", name, col, col["spearman_by_model"])
                     for name, col in doc[set_key].items()]
    for what, column, s, rho in rows:
        order = ", ".join(f"{k if k[-1] in 'BM' else k + 'B'} {v:.2f}" for k, v in rho.items()) if rho else ""
        print(f"{what:<50}{column:<18}{s['mean_abs_pct']:>8.1f}%{s['mean_pct']:>+8.1f}%{s['max_abs_pct']:>8.1f}%   "
              f"{order}".rstrip())
    print(f"\n{'target':<62}{'target':>8}{'measured':>10}{'ratio':>8}")
    for key, (what, target) in TARGETS.items():
        value = doc["measured"][key]
        better = "min_spearman" != key
        ratio = value / target if better else target / value
        print(f"{what:<62}{target:>8.2f}{value:>10.2f}{ratio:>8.2f}{'  (met)' if ratio <= 1 else ''}")
    for key in ("multi_node", *(key for key, _, _, _ in SELENE_SETS), *mpt_counts):
        refused = {where: why for col in doc[key].values() for where, why in col["not_predicted"].items()}
        for where, why in refused.items():
            print(f"not predicted, {where}: {why}")
    print(f"\n(ratio < 1 meets a target; wall time {doc['wall_s']:.0f} s; figure {doc['figure']})")


if __name__ == "__main__":
    main()
