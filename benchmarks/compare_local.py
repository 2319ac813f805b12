"""How well the twin predicts this host: calibrate once, then simulate and execute many plans.

    .venv/bin/python benchmarks/compare_local.py [--nproc 2|4] [--machine FILE] [--steps 7] [--json]

1. `twin calibrate` on --nproc ranks of this host (skipped with --machine: use
   that calibrated file instead), written to out/compare_local/local.toml;
2. for each (model, plan) of PLANS: build the schedule for that machine,
   simulate it, execute it with the executor (torchrun, gloo on CPU), and
   compare (executor.compare): simulated and measured (median) step time;
3. one table, per plan: simulated and measured step time, the error, and the
   measured steps' spread (max-min over median: the host's own noise); then
   the mean absolute step-time error. The target on the project's 2-core host
   is under 10%.

Nothing here is fitted to these plans: the machine file comes from the
microbenchmarks alone (executor.calibrate). Every measurement waits for the
host to be quiet first and is repeated (--retries) when other processes
loaded it meanwhile; the table shows what other load remained.

Why 2 ranks by default: on a 2-core host one rank per core is the host as
two devices. With 4 ranks (`--nproc 4 --machine topologies/local.toml`) two
ranks share each core, and a rank's compute rate then depends on how many
others are busy at that moment (half a core in lockstep, a whole one while
the others wait, e.g. in a pipeline's bubble): no per-device model, the
simulator's included, can express that, and the 4-rank error is about twice
the 2-rank one. Results on the project's 2-core VM (Intel Xeon, 2 vCPUs,
quiet host, executor commit of this file): 2 ranks, mean absolute step-time
error 5.5% and 12.7% in two runs (the second uniformly under-predicted: the
calibration minutes earlier ran ~10% faster); 4 ranks 17.7-20.8%.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.calibrate_host import calibrate_host  # noqa: E402
from executor.compare import simulate_and_execute  # noqa: E402
from executor.launch import WorkerOptions, other_load, wait_for_quiet  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.ir_io import save_schedule  # noqa: E402
from twin.model import get_model, parse_model_spec  # noqa: E402
from twin.plan import parse_plan  # noqa: E402

BUSY_CORES = 0.3  # other load above which a measurement is repeated
SMALL = "layers=2,hidden=512,heads=8,seq=128,vocab=2048"  # 'small': tiny x 2 in width
DEEP = "layers=4,hidden=256,heads=4,seq=256,vocab=1024"  # 'deep': tiny x 2 in depth and sequence
# (model, plan, global batch) per rank count: every layout the builder makes, overlap on and off, pipelines.
PLANS = {
    2: [
        ("tiny", "gx=2", 8),
        ("tiny", "gy=2", 8),
        ("tiny", "gz=2", 8),
        ("tiny", "gdata=2", 8),
        ("tiny", "gx=2,oar=0,ors=0,oag=0", 8),
        ("tiny", "gz=2,recompute=none", 8),
        ("tiny", "tp=1,pp=2,mbs=2", 8),
        (SMALL, "gx=2", 8),
        (SMALL, "gz=2", 8),
        (DEEP, "gdata=2,zero=1", 8),
        (DEEP, "gy=2,recompute=none", 8),
    ],
    4: [
        ("tiny", "gx=4", 8),
        ("tiny", "gy=4", 8),
        ("tiny", "gz=4", 8),
        ("tiny", "gdata=4", 8),
        ("tiny", "gx=2,gz=2", 8),
        ("tiny", "gx=2,gy=2,oar=0,ors=0,oag=0", 8),
        ("tiny", "gx=2,gdata=2,recompute=none", 8),
        ("tiny", "tp=2,pp=2,mbs=2", 8),
        (SMALL, "gx=2,gz=2", 8),
        (SMALL, "gx=4,recompute=none", 8),
        (DEEP, "gz=2,gdata=2,zero=3", 8),
        (DEEP, "gx=2,gdata=2,zero=1", 8),
    ],
}


def model_of(name: str):
    return parse_model_spec(name, "small" if name == SMALL else "deep") if "=" in name else get_model(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks: 2 (one per core on a 2-core host) or 4")
    ap.add_argument("--machine", help="an already calibrated machine file (skips calibration)")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", help="working folder (default out/compare_local-<nproc>)")
    ap.add_argument("--quiet-wait", type=float, default=120.0,
                    help="seconds to wait, before each measurement, for other processes to leave the host (0: do not wait)")
    ap.add_argument("--retries", type=int, default=2, help="measure again while the host was busy (default 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.out = args.out or f"out/compare_local-{args.nproc}"
    os.makedirs(args.out, exist_ok=True)
    quiet = (lambda: wait_for_quiet(max_wait_s=args.quiet_wait)) if args.quiet_wait > 0 else (lambda: None)

    def measured_quietly(measure, out_dir: str):
        """Run `measure`; again (up to --retries times) while other processes loaded the host during it."""
        for attempt in range(args.retries + 1):
            quiet()
            result = measure()
            load = other_load(out_dir)
            if load is None or load <= BUSY_CORES or attempt == args.retries:
                return result
            print(f"  the host was busy ({load:.2f} cores of other load): measuring again", file=sys.stderr)
        return result

    machine_path = args.machine
    if machine_path is None:
        machine_path = os.path.join(args.out, "local.toml")
        start = time.perf_counter()
        print(f"calibrating {args.nproc} ranks -> {machine_path} ...", file=sys.stderr)
        cal_dir = os.path.join(args.out, "calibrate")
        measured_quietly(lambda: calibrate_host(args.nproc, machine_path, cal_dir, WorkerOptions(steps=3, warmup=1)), cal_dir)
        print(f"  calibrated in {time.perf_counter() - start:.0f} s (other load {other_load(cal_dir) or 0:.2f} cores)",
              file=sys.stderr)
    machine = load_machine(machine_path)
    rows = []
    if args.nproc not in PLANS:
        ap.error(f"--nproc must be one of {sorted(PLANS)}")
    for model_name, plan_text, batch in PLANS[args.nproc]:
        model = model_of(model_name)
        plan = parse_plan(plan_text, parse_plan(f"global_batch={batch}"))
        built = build_step(model, plan, machine, args.nproc)
        tag = f"{model.name}-{plan_text.replace(',', '_').replace('=', '')}"
        path = os.path.join(args.out, f"{tag}.json")
        save_schedule(built.schedule, path)
        opts = WorkerOptions(steps=args.steps, warmup=args.warmup, machine=machine_path)
        run_dir = os.path.join(args.out, tag)
        c, _, _ = measured_quietly(
            lambda: simulate_and_execute(built.schedule, path, machine_path, args.nproc, run_dir, opts), run_dir)
        background = other_load(run_dir)
        steps = sorted(c.measured_steps_s)
        spread = (steps[-1] - steps[0]) / c.measured_step_s
        rows.append({"model": model.name, "plan": built.plan.describe(), "ops": len(built.schedule.programs[0].ops),
                     "simulated_s": c.simulated_step_s, "measured_s": c.measured_step_s, "error": c.step_error,
                     "spread": spread, "other_load_cores": background, "by_class": c.to_json_dict()["by_class"]})
        print(f"  {model.name:<6} {plan_text:<32} sim {c.simulated_step_s:8.4f} s  measured {c.measured_step_s:8.4f} s  "
              f"{100 * c.step_error:+6.1f}%", file=sys.stderr)
    mean_abs = sum(abs(r["error"]) for r in rows) / len(rows)
    result = {"machine": machine_path, "nproc": args.nproc, "steps": args.steps, "rows": rows,
              "mean_abs_step_error": mean_abs}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'model':<7}{'plan':<72}{'ops':>5}{'sim s':>9}{'meas s':>9}{'error':>8}{'spread':>8}{'other':>7}")
    for r in rows:
        load = r["other_load_cores"]
        print(f"{r['model']:<7}{r['plan']:<72}{r['ops']:>5}{r['simulated_s']:>9.4f}{r['measured_s']:>9.4f}"
              f"{100 * r['error']:>+7.1f}%{100 * r['spread']:>7.0f}%{load if load is not None else float('nan'):>7.2f}")
    print("spread: (slowest - fastest measured step) / median; other: cores other processes kept busy during the run")
    print(f"mean absolute step-time error: {100 * mean_abs:.1f}% over {len(rows)} plans "
          f"({args.nproc} ranks, machine {machine_path}; target < 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
