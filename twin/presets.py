"""Named configurations from the papers, runnable with `twin simulate --preset NAME`.

Each is exactly what its source ran (or, where marked, what follows from it
by arithmetic); the prediction is the twin's, never the published number.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.errors import TwinError


@dataclass(frozen=True)
class Preset:
    name: str
    machine: str
    model: str
    gpus: int
    plan: str
    global_batch: int
    source: str


_FRONTIER_SCRIPTS = "Dash et al. ISC'24 launch scripts (github sajal-vt/Megatron-DeepSpeed-ORNL, branch FA2, Jan 2024)"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("frontier-22b", "frontier", "22B", 16, "tp=1,pp=8,dp=2,zero=0,mbs=1,recompute=full", 640, _FRONTIER_SCRIPTS),
        Preset("frontier-175b", "frontier", "175B", 128, "tp=4,pp=16,dp=2,zero=1,mbs=1,recompute=full", 640, _FRONTIER_SCRIPTS),
        Preset("frontier-1t", "frontier", "1T", 1024, "tp=4,pp=128,dp=2,zero=1,mbs=1,recompute=full", 1024, _FRONTIER_SCRIPTS),
        Preset("frontier-1t-3072", "frontier", "1T", 3072, "tp=4,pp=128,dp=6,zero=1,mbs=1,recompute=full", 3072,
               _FRONTIER_SCRIPTS + " [derived: the same TP4 PP128 replica with DP6, batch grown with DP]"),
        Preset("axonn-gpt80b-8192", "frontier", "GPT-80B", 8192, "gx=8,gy=1,gz=16,gdata=64", 8192,
               "AxoNN SC'24 Table III row; the plan is hand-chosen here (the paper's is not published)"),
    ]
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise TwinError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name]
