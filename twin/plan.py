"""ParallelPlan: how one training step is split over the GPUs.

One validated dataclass for every parallel scheme the twin models, in AxoNN's
names: G = gdata x gx x gy x gz, a 3D tensor-parallel matrix multiply on the
gx x gy x gz grid inside each of gdata data-parallel groups (gz also shards
the weights, ZeRO-3 style, and splits the batch). gx only = Megatron-LM
tensor parallelism; gz only = FSDP; gz + gdata = HSDP.

Batch bookkeeping. `global_batch` sequences per step are split over the
gdata x gz ranks that see different data, so each rank processes
global_batch / (gdata gz) sequences per step, in `grad_accum` micro-batches of
`mbs` sequences. When neither mbs nor ga is given, the largest micro-batch that
fits in device memory is chosen (twin.memory.resolve_micro_batch).

The overlap switches are AxoNN's (reference/algorithms.md section 2):
oar (backward all-reduce of dI overlaps the dW GEMM), ors (reduce-scatter of dW
waited only at the end of backward), oag (next layer's weight all-gather
prefetched one layer ahead). `tune_gemm` picks, per GEMM, the fastest of the
NN/NT/TN layouts as AxoNN does in its first batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from twin.errors import TwinError
from twin.model import ModelSpec

RECOMPUTE_MODES = ("full", "none")
_BOOL_WORDS = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


@dataclass(frozen=True)
class ParallelPlan:
    gx: int = 1
    gy: int = 1
    gz: int = 1
    gdata: int = 1
    global_batch: int = 0
    mbs: int = 0  # sequences per rank per micro-batch; 0 = derive
    ga: int = 0  # micro-batches per step (gradient accumulation); 0 = derive
    recompute: str = "full"
    oar: bool = True
    ors: bool = True
    oag: bool = True
    tune_gemm: bool = True

    @property
    def world_size(self) -> int:
        return self.gx * self.gy * self.gz * self.gdata

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs that share one copy of the weights (the 3D tensor-parallel grid)."""
        return self.gx * self.gy * self.gz

    @property
    def sequences_per_rank(self) -> int:
        return self.global_batch // (self.gdata * self.gz)

    @property
    def overlap(self) -> bool:
        return self.oar or self.ors or self.oag

    def without_overlap(self) -> "ParallelPlan":
        return replace(self, oar=False, ors=False, oag=False)

    def describe(self) -> str:
        """The plan as the --plan string that reproduces it."""
        parts = [f"gx={self.gx}", f"gy={self.gy}", f"gz={self.gz}", f"gdata={self.gdata}"]
        if self.mbs:
            parts.append(f"mbs={self.mbs}")
        if self.ga:
            parts.append(f"ga={self.ga}")
        parts.append(f"recompute={self.recompute}")
        for switch in ("oar", "ors", "oag"):
            parts.append(f"{switch}={int(getattr(self, switch))}")
        parts.append(f"tune={int(self.tune_gemm)}")
        return ",".join(parts)


_INT_KEYS = {"gx", "gy", "gz", "gdata", "mbs", "ga", "global_batch"}
_BOOL_KEYS = {"oar", "ors", "oag", "tune"}
_KEYS = _INT_KEYS | _BOOL_KEYS | {"recompute"}


def parse_plan(text: str, base: ParallelPlan | None = None) -> ParallelPlan:
    """Parse 'gx=8,gy=1,gz=16,gdata=64[,mbs=..,ga=..,recompute=full|none,oar=0,..,tune=0]'.

    Unknown keys and malformed values are one-line TwinErrors naming the item.
    """
    values: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip().lower(), raw.strip()
        if not sep or not raw:
            raise TwinError(f"--plan: {item!r} is not key=value (example: gx=8,gy=1,gz=16,gdata=64)")
        if key not in _KEYS:
            raise TwinError(f"--plan: unknown key {key!r}; allowed keys are {', '.join(sorted(_KEYS))}")
        if key in _INT_KEYS:
            try:
                values[key] = int(raw)
            except ValueError:
                raise TwinError(f"--plan: {key}={raw!r} is not an integer") from None
            if values[key] < (0 if key in ("mbs", "ga") else 1):  # type: ignore[operator]
                raise TwinError(f"--plan: {key}={raw} must be a positive integer")
        elif key in _BOOL_KEYS:
            if raw.lower() not in _BOOL_WORDS:
                raise TwinError(f"--plan: {key}={raw!r} must be 0 or 1")
            values["tune_gemm" if key == "tune" else key] = _BOOL_WORDS[raw.lower()]
        else:
            if raw not in RECOMPUTE_MODES:
                raise TwinError(f"--plan: recompute={raw!r} is unknown; use one of {', '.join(RECOMPUTE_MODES)}")
            values[key] = raw
    plan = base or ParallelPlan()
    return replace(plan, **values)  # type: ignore[arg-type]


def _require_divides(divisor: int, value: int, what: str, fix: str) -> None:
    if value % divisor:
        raise TwinError(f"{what}: {value} is not divisible by {divisor}; {fix}")


def validate_plan(plan: ParallelPlan, model: ModelSpec, n_gpus: int) -> None:
    """Raise a one-line TwinError for every plan the 4D algorithm cannot run.

    Memory fit is checked separately (twin.memory.check_fit), since it needs a
    device.
    """
    degrees = f"gx={plan.gx} x gy={plan.gy} x gz={plan.gz} x gdata={plan.gdata}"
    if plan.world_size != n_gpus:
        raise TwinError(
            f"--plan: {degrees} = {plan.world_size} GPUs, but --gpus is {n_gpus}; "
            "make the product of the degrees equal the GPU count"
        )
    if plan.global_batch <= 0:
        raise TwinError("--global-batch must be a positive number of sequences")
    h, f = model.hidden, model.ffn
    _require_divides(plan.gx, model.heads, "model heads (split over gx)", "choose gx dividing the head count")
    _require_divides(plan.gx, h, "model hidden (split over gx)", "choose gx dividing hidden")
    _require_divides(plan.gy, h, "model hidden (split over gy)", "choose gy dividing hidden")
    _require_divides(plan.gx, f, "model ffn (split over gx)", "choose gx dividing ffn")
    _require_divides(plan.gy, f, "model ffn (split over gy)", "choose gy dividing ffn")
    _require_divides(plan.gx, model.vocab, "model vocab (LM head split over gx)", "choose gx dividing the vocabulary")
    for name, k, n, _ in model.linear_shapes():
        block = k * n // (plan.gx * plan.gy)
        _require_divides(plan.gz, block, f"{name} weight block k*n/(gx*gy) (sharded over gz)", "choose a gz that divides it")
    _require_divides(
        plan.gdata * plan.gz, plan.global_batch, "--global-batch (split over gdata*gz)",
        f"use a multiple of gdata*gz = {plan.gdata * plan.gz} sequences",
    )
    per_rank = plan.sequences_per_rank
    if plan.mbs and plan.ga and plan.mbs * plan.ga != per_rank:
        raise TwinError(
            f"--plan: mbs={plan.mbs} x ga={plan.ga} != {per_rank} sequences per rank "
            "(global_batch / (gdata*gz)); give only one of mbs, ga"
        )
    if plan.mbs:
        _require_divides(plan.mbs, per_rank, "sequences per rank (global_batch / (gdata*gz))", "choose mbs dividing it")
    if plan.ga:
        _require_divides(plan.ga, per_rank, "sequences per rank (global_batch / (gdata*gz))", "choose ga dividing it")


def with_micro_batch(plan: ParallelPlan, mbs: int) -> ParallelPlan:
    """The plan with its micro-batch size fixed (and gradient accumulation implied)."""
    return replace(plan, mbs=mbs, ga=plan.sequences_per_rank // mbs)
