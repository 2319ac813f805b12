"""The executor: the very schedule IR the simulator runs, executed with torch.distributed and timed.

    twin export --machine local --model tiny --gpus 4 --plan gx=2,gy=1,gz=2,gdata=1 -o step.json
    twin run step.json --nproc 4                   # torchrun; gloo on CPU, NCCL on GPUs; trace + summary
    twin run step.json --nproc 4 --check-numerics  # real data through the 4D layers vs one process
    twin calibrate --nproc 4 -o topologies/local.toml
    twin compare step.json --machine topologies/local.toml --nproc 4

One module per job; only the modules marked (torch) import torch, and only
the worker processes import those, so twin (and `twin --help`) runs without it:

- program     Schedule -> what one rank runs: ops in issue order, the channel
              (process group) of each comm op, and where the host must wait.
- channels    (torch) the process groups, created once: one per (group axis,
              stream) instance, a stream each (gloo: one worker thread).
- kernels     (torch) the work of each op over preallocated, shared tensors.
- runtime     (torch) the compiled rank program: the step loop and its timing
              (perf_counter on CPU, CUDA events on GPU), failures named by op.
- numerics    (torch) --check-numerics: the linear layers' data bound to real
              tensors, checked against a float64 single-process reference.
- worker      (torch) the per-rank entry point torchrun/srun starts.
- launch      torchrun on this host (failures turned into one line naming
              the rank and op), or the srun lines for Frontier, Perlmutter, Alps.
- measured    the ranks' files -> RankTimelines, the simulator's trace format
              and `twin simulate --json`'s summary keys.
- calibrate   microbenchmark schedule, fit to twin.sim's device and collective
              formulas.
- machinefile the calibrated machine file and its audit by twin.sim's models.
- compare     simulated vs measured per op class and per step; figures.
- cli         twin run / calibrate / compare (added to twin's parser).

Element type: the IR's on GPU; float32 on CPU (see target.choose_target for
why even on a CPU with native bf16). Byte counts of communication and
element-wise ops are always the IR's.

Imports twin's IR and helpers, never the other way round.
"""
