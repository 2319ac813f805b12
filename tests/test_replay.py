"""Blocks copied from a recording (twin.builders.replay) equal blocks written op by op.

Every plan below is built twice, with REPLAY off (every block written
through the builder) and on, and the two schedules must be equal: every
program's ops, in order, with their ids, names, streams, works, dependencies
and tags, and the groups. The plans cover every axis (4D, pipelines, 1F1B and
interleaved, context parallelism, sequence parallelism, ZeRO 1-3), every
overlap switch, each recompute and attention kind, recompute of some layers (rcl) and micro-batches of one and
more sequences, and a Llama block with recompute=op and eager kernels; each is checked to have copied blocks at all.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from twin.builders import replay
from twin.builders.replay import BlockRecorder, Recording
from twin.builders.schedule import StageProgramWriter, build_schedule
from twin.model import ModelSpec
from twin.plan import parse_plan

MODEL = ModelSpec("replay-test", layers=8, hidden=512, heads=8, seq=128)

SWITCHES = [f"oar={a},ors={b},oag={c}" for a, b, c in itertools.product((0, 1), repeat=3)]
PLANS = [
    *(f"gx=2,gy=2,gz=2,mbs=1,ga=4,{s}" for s in SWITCHES),
    *(f"gx=2,gy=2,gz=2,mbs=2,ga=3,recompute={r},attention={a}"
      for r, a in itertools.product(("none", "selective", "full"), ("flash", "unfused"))),
    "gx=4,gdata=2,sp=1,mbs=1,ga=4",
    "gx=2,gdata=4,zero=1,mbs=1,ga=4",
    "gx=2,gdata=4,zero=2,mbs=2,ga=2",
    "gx=2,gz=2,gdata=2,zero=3,mbs=1,ga=4,recompute=selective,attention=unfused",
    "gx=2,cp=2,mbs=1,ga=4",
    "gx=2,cp=2,mbs=2,ga=2,recompute=none",
    "gx=2,pp=2,mbs=1,ga=6",
    "gx=2,pp=4,mbs=1,ga=8,recompute=selective,attention=unfused",
    "gx=2,gz=2,pp=2,vpp=2,mbs=1,ga=4",
    "tp=2,pp=2,dp=2,zero=1,sp=1,mbs=2,ga=4",
    *(f"gx=2,gz=2,pp=2,mbs=1,ga=4,recompute=none,reshard=1,oag={g}" for g in (0, 1)),
    "gz=2,gdata=2,zero=3,mbs=1,ga=3,recompute=selective,attention=unfused,reshard=1",
    "gx=2,gz=2,pp=2,vpp=2,mbs=1,ga=4,rcl=1",  # only the first layer of each chunk recomputes
    "gx=2,gz=2,gdata=2,mbs=1,ga=3,rcl=5,oag=0",
    *(f"gx=2,gz=2,gdata=2,mbs=1,ga=3,rcl=3,reshard=1,oag={g}" for g in (0, 1)),  # the others gather again
    "gz=2,pp=2,vpp=2,mbs=1,ga=4,rcl=1,reshard=1",
    "tp=2,pp=2,dp=2,sp=1,fp8=1,mbs=1,ga=4,rcl=2",
    "tp=2,pp=2,dp=2,sp=1,fp8=1,fp8pg=1,zero=1,odp=1,mbs=1,ga=4",
]


def _plan(text: str):
    plan = parse_plan(text)
    return replace(plan, global_batch=plan.mbs * plan.ga * plan.batch_split)


@pytest.fixture
def written(monkeypatch):
    def build(model, plan):
        monkeypatch.setattr(replay, "REPLAY", False)
        try:
            return build_schedule(model, plan)
        finally:
            monkeypatch.setattr(replay, "REPLAY", True)
    return build


# A Llama block (SwiGLU, rotary embedding, grouped-query attention) and what only it runs: recompute=op
LLAMA = ModelSpec("replay-llama", layers=8, hidden=512, heads=8, kv_heads=2, seq=128, ffn=1024, arch="llama",
                  dropout=False)
LLAMA_PLANS = [
    *(f"gz=2,gdata=2,mbs=1,ga=3,recompute=op,reshard={r},oag={g}" for r, g in itertools.product((0, 1), repeat=2)),
    "gz=2,pp=2,vpp=2,mbs=1,ga=4,recompute=op,reshard=1",
    "gx=2,gz=2,mbs=2,ga=2,recompute=none,reshard=1",
    "gz=2,gdata=2,mbs=2,ga=3,recompute=op,reshard=1,kernels=eager",  # torchtitan's element-wise work, op by op
    "gx=2,gz=2,pp=2,mbs=1,ga=4,recompute=full,kernels=eager",
]


@pytest.mark.parametrize("model, text", [(MODEL, t) for t in PLANS] + [(LLAMA, t) for t in LLAMA_PLANS])
def test_copied_blocks_equal_written_ones(model, text, written):
    plan = _plan(text)
    copied = build_schedule(model, plan)
    reference = written(model, plan)
    assert copied.groups == reference.groups
    for a, b in zip(copied.programs, reference.programs, strict=True):
        assert a.ranks == b.ranks
        assert len(a.ops) == len(b.ops)
        for x, y in zip(a.ops, b.ops):
            assert x == y, f"{text}: op {y.id} {y.name}"
    assert copied == reference
    stage = StageProgramWriter(model, plan, 0)
    stage.write()
    assert stage.blocks.copies > 0, "nothing was copied"


def test_a_block_is_recorded_the_second_time_and_copied_from_the_third():
    """A schedule of one layer and micro-batch (the search's screen) records nothing; one with more copies."""
    one = StageProgramWriter(replace(MODEL, layers=1), _plan("gx=2,gy=2,mbs=1,ga=1"), 0)
    one.write()
    assert not any(isinstance(r, Recording) for r in one.blocks._recordings.values()) and one.blocks.copies == 0
    many = StageProgramWriter(MODEL, _plan("gx=2,gy=2,mbs=1,ga=4"), 0)
    many.write()
    assert sum(isinstance(r, Recording) for r in many.blocks._recordings.values()) >= 3
    # 8 layers x 4 micro-batches x 3 passes (forward, recompute, backward), of which a few kinds' first two written
    assert many.blocks.copies >= 8 * 4 * 3 - 2 * 8


def test_a_block_that_cannot_be_relabelled_is_written_every_time(monkeypatch, written):
    """An op whose name does not carry its layer where the tag says (here: every forward GEMM renamed) is never
    copied; the schedule still equals the written one."""
    from twin.builders import linears

    real = linears.LinearWriter.named

    def renamed(at, lin, role):
        name, tag = real(at, lin, role)
        return (f"{at.label}.gemm-of-{lin.block}" if role == "gemm" else name), tag

    monkeypatch.setattr(linears.LinearWriter, "named", staticmethod(renamed))
    plan = _plan("gx=2,gy=2,mbs=1,ga=4")
    recorder = BlockRecorder()
    monkeypatch.setattr("twin.builders.layer.BlockRecorder", lambda: recorder)
    copied = build_schedule(MODEL, plan)
    assert copied == written(MODEL, plan)
    forward = [r for k, r in recorder._recordings.items() if k[0][0] == "forward" and k[1] == "fwd"]
    assert forward and all(r is None for r in forward)
