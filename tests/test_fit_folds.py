"""Cross-validation folds hold whole groups of runs that repeat one micro-batch (twin.fit.solve.fold_of),
and the fact about vTrain's single-node file that makes it matter."""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from test_cli import assert_user_error, run
from twin.errors import TwinError
from twin.fit.solve import fold_of, repeat_key
from twin.runs import load_runs

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
SINGLE_NODE = DATA / "a100-megatron-single-node.csv"
ASSUME = "attention=unfused,recompute=full,dtype=fp16,optimizer=flat"


def test_runs_that_differ_only_in_data_parallelism_and_batch_share_a_fold():
    runs = load_runs(str(SINGLE_NODE), ASSUME)
    fold = fold_of(runs, 5)
    by_key: dict[tuple, set[int]] = defaultdict(set)
    for measured, k in zip(runs, fold):
        by_key[repeat_key(measured)].add(int(k))
    assert all(len(ks) == 1 for ks in by_key.values())
    assert len(by_key) == 288  # 2 hidden sizes x 4 depths x tp x pp x mbs as the file runs them
    assert sorted(set(fold.tolist())) == [0, 1, 2, 3, 4]
    assert min(np.bincount(fold)) > 200  # the groups spread over the folds, none left nearly empty


def test_a_plan_at_another_micro_batch_size_is_another_group():
    runs = load_runs(str(SINGLE_NODE), ASSUME)
    first = runs[0]
    other = replace(first, plan=replace(first.plan, mbs=first.plan.mbs * 2))
    plan = first.plan
    wider = replace(first, plan=replace(plan, gdata=plan.gdata * 2, global_batch=plan.global_batch * 4))
    assert repeat_key(other) != repeat_key(first)
    assert repeat_key(wider) == repeat_key(first)


def test_more_folds_than_groups_is_a_one_line_error():
    runs = load_runs(str(SINGLE_NODE), ASSUME)
    one_group = [r for r in runs if repeat_key(r) == repeat_key(runs[0])]
    assert len(one_group) > 2
    with pytest.raises(TwinError, match="--folds 2: the runs hold only 1 distinct"):
        fold_of(one_group, 2)


def test_the_single_node_files_groups_lie_on_lines_with_one_slope_whatever_dp():
    """What docs/fit.md ("What the calibration file holds") says of the data: within a group (model, tp, pp,
    mbs, dp) the steps are a line in the micro-batch count to rounding, and the line's slope does not depend on
    dp. So its 1,440 rows repeat 216 micro-batch times; a row-by-row fold would test a measured micro-batch the
    fit has already seen."""
    with SINGLE_NODE.open() as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        dp, mbs = int(r["data parallelism"]), int(r["micro batch"])
        key = (r["hidden size"], r["# layers"], r["tensor parallelism"], r["pipeline parallelism"], mbs, dp)
        groups[key].append((int(r["global batch"]) // dp // mbs, float(r["iteration time (ms)"])))
    slopes: dict[tuple, list[float]] = defaultdict(list)
    worst = 0.0
    for key, points in groups.items():
        if len(points) < 2:
            continue
        m, t = np.array(points).T
        line = np.polyfit(m, t, 1)
        worst = max(worst, float(np.abs(np.polyval(line, m) - t).max()))
        slopes[key[:5]].append(float(line[0]))
    assert worst < 1e-6  # milliseconds: no measurement noise off the line
    assert len(slopes) == 216
    assert max(np.ptp(s) for s in slopes.values()) < 1e-6  # one micro-batch time per (model, tp, pp, mbs)
    assert sum(len(s) > 1 for s in slopes.values()) > 100  # ...and it is seen at two or three dp degrees


def test_twin_fit_with_more_folds_than_plans_is_exit_2_before_simulating(tmp_path, capsys):
    """Two plans, each at three batches: six runs, two groups; --folds 3 cannot hold out whole plans."""
    runs = tmp_path / "two-plans.csv"
    rows = [f'2,256,4,256,{gpus},"{plan}",{batch},{10.0 * batch}'
            for gpus, plan in ((1, "tp=1"), (2, "tp=2")) for batch in (2, 4, 8)]
    runs.write_text("layers,hidden,heads,seq,gpus,plan,global_batch,step_time_ms\n" + "\n".join(rows) + "\n")
    out_file = tmp_path / "o.toml"
    rc, out, err = run(capsys, "fit", "--machine", "dgx-a100", "--runs", str(runs), "-o", str(out_file),
                       "--params", "device.launch_interval_us", "--folds", "3")
    assert_user_error(rc, out, err, "--folds 3", "only 2 distinct")
    assert not out_file.exists()
