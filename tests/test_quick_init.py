"""twin.quick_init: the faster constructors of the IR's hot frozen dataclasses keep their signature and semantics."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from twin.ir import P2P, Attention, Collective, Elementwise, Gemm, Op, OpTag
from twin.quick_init import positional, quick_init


@pytest.mark.parametrize("cls", [Gemm, Attention, Elementwise, Collective, P2P, OpTag, Op])
def test_quick_init_keeps_the_dataclass_signature_and_frozenness(cls) -> None:
    """twin.quick_init replaces the generated __init__ of the IR's hot classes: the signature (names, kinds,
    defaults) must be the one dataclasses writes for the same fields, and the object still frozen."""
    params = cls.__dataclass_params__
    reference = dataclasses.make_dataclass(
        f"Reference{cls.__name__}",
        [(f.name, f.type, dataclasses.field(default=f.default, kw_only=f.kw_only)) if f.default is not dataclasses.MISSING
         else (f.name, f.type, dataclasses.field(kw_only=f.kw_only)) for f in dataclasses.fields(cls)],
        frozen=params.frozen)
    ours, theirs = inspect.signature(cls.__init__), inspect.signature(reference.__init__)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.parameters.values()]
    # every field set from its argument, the others from their defaults, and assignment refused afterwards
    values = {f.name: f"value-{f.name}" for f in dataclasses.fields(cls)}
    made = cls(**values)
    assert {name: getattr(made, name) for name in values} == values
    required = {f.name: 1 for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    defaulted = cls(**required)
    assert all(getattr(defaulted, f.name) == f.default for f in dataclasses.fields(cls) if f.name not in required)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, "changed")
    assert dataclasses.replace(made, **{dataclasses.fields(cls)[-1].name: "other"}) != made


def test_quick_init_refuses_what_it_cannot_keep() -> None:
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        scale: dataclasses.InitVar[int] = 1

    for cls in (Mutable, Checked, WithInitVar):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


def test_a_tag_made_from_its_fields_in_order_is_the_tag() -> None:
    """The builder makes op tags with twin.quick_init.positional (no __init__, no keywords): the same object."""
    values = {f.name: f"value-{f.name}" for f in dataclasses.fields(OpTag)}
    made = positional(OpTag)(*values.values())
    assert made == OpTag(**values) and hash(made) == hash(OpTag(**values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.role = "changed"
