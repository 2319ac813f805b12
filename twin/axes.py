"""The parallel axes, one entry each: the registry the plan, the mesh, the search and the help texts read.

An axis is a degree of a ParallelPlan that lays ranks out on the mesh: the
product of the degrees is the world size. From AXES come:

- the plan's --plan keys and their aliases (twin.plan.parse_plan), the
  range each degree may take and `describe`'s text;
- validation: world size, and the model dimensions each degree must divide
  (twin.plan_checks.validate_plan);
- the mesh, innermost axis first (twin.mesh.plan_mesh): the order decides
  which ranks are neighbours, hence which groups sit inside a node;
- the search space's axes, and which of them a search varies by default
  (twin.search.space);
- the help texts of --plan and --axes (twin.cli).

A new axis is one entry here, its degree as a field of twin.plan.ParallelPlan
(a test checks the two agree), and the builder's pass that uses its groups.
Options that are not degrees (vpp, zero, sp, recompute, attention, mbs, ga,
the overlap switches) stay the plan's own: they lay out no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Divides:
    """A model dimension the axis's degree (times `factor`) must divide, and how an error says so.

    `what` and `fix` are formatted with {axis} (the degree's key) and
    {factor}: the error reads "<what>: <value> is not divisible by <n>; <fix>".
    """

    dimension: str  # a ModelSpec attribute: heads, kv_heads, hidden, ffn, vocab, seq
    what: str
    fix: str
    factor: int = 1


@dataclass(frozen=True)
class Axis:
    """One parallel axis: its plan key, its mesh axis, what it means and what it must divide."""

    key: str  # ParallelPlan field and --plan key
    mesh: str  # the Mesh axis (and the IR's group name)
    meaning: str  # one phrase, for help texts
    aliases: tuple[str, ...] = ()  # other --plan names (Megatron-LM's)
    always_described: bool = True  # describe() writes it even at 1 (AxoNN's four do, so plan texts stay stable)
    searched_by_default: bool = True  # twin search varies it unless --axes says otherwise
    splits_batch: bool = False  # its ranks see different sequences (the global batch is split over it)
    divides: tuple[Divides, ...] = ()


AXES: tuple[Axis, ...] = (  # innermost first: the mesh's order
    Axis("gx", "x", "AxoNN's X (Megatron's tensor parallelism when alone): heads and the MLP's columns",
         aliases=("tp",), divides=(
             Divides("heads", "model heads (split over {axis})", "choose {axis} dividing the head count"),
             Divides("kv_heads", "model kv_heads (K/V heads split over {axis})",
                     "choose {axis} dividing the K/V head count"),
             Divides("hidden", "model hidden (split over {axis})", "choose {axis} dividing hidden"),
             Divides("ffn", "model ffn (split over {axis})", "choose {axis} dividing ffn"),
             Divides("vocab", "model vocab (LM head split over {axis})", "choose {axis} dividing the vocabulary"))),
    Axis("gy", "y", "AxoNN's Y: the linears' other dimension", divides=(
        Divides("hidden", "model hidden (split over {axis})", "choose {axis} dividing hidden"),
        Divides("ffn", "model ffn (split over {axis})", "choose {axis} dividing ffn"))),
    Axis("gz", "z", "AxoNN's Z: tokens, and the weights sharded (FSDP when alone)", splits_batch=True),
    Axis("cp", "cp", "context parallelism: each sequence's tokens, ring attention passing K/V",
         always_described=False, searched_by_default=False, divides=(
             Divides("seq", "model seq (split into 2*cp chunks, two per rank, for causal balance)",
                     "choose cp with 2*cp dividing the sequence length", factor=2),)),
    Axis("gdata", "data", "data parallelism (ZeRO shards over it)", aliases=("dp",), splits_batch=True),
    Axis("pp", "pp", "pipeline stages (1F1B; interleaved with vpp)", always_described=False),
)

KEYS: tuple[str, ...] = tuple(axis.key for axis in AXES)
DEFAULT_SEARCH: tuple[str, ...] = tuple(axis.key for axis in AXES if axis.searched_by_default)
ALIASES: dict[str, str] = {alias: axis.key for axis in AXES for alias in axis.aliases}
BATCH_KEYS: tuple[str, ...] = tuple(axis.key for axis in AXES if axis.splits_batch)  # gz, gdata
# the order divisibility is checked in
DIMENSIONS: tuple[str, ...] = ("heads", "kv_heads", "hidden", "ffn", "vocab", "seq")


def degrees_text(degrees: dict[str, int]) -> str:
    """'gx=2,gy=1,gz=4,gdata=8[,pp=..]': the degrees as --plan keys, in the registry's order; an axis that is not
    always described only when above 1."""
    return ",".join(f"{axis.key}={degrees[axis.key]}" for axis in AXES
                    if axis.always_described or degrees[axis.key] > 1)


def help_text() -> str:
    """The axes for --plan and --axes help: 'gx (tp): AxoNN's X ...; gy: ...'."""
    return "; ".join(f"{axis.key}{' (' + ', '.join(axis.aliases) + ')' if axis.aliases else ''}: {axis.meaning}"
                     for axis in AXES)
