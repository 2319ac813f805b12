"""A faster constructor for the IR's frozen, slotted dataclasses, with the same signature and semantics.

A frozen dataclass sets each field in __init__ through
`object.__setattr__(self, name, value)`: a name lookup and a generic call
per field. A deep pipeline's step holds over a million ops, each an Op, an
OpTag and a Work, and a search builds thousands of steps, so that cost is
a tenth of a search's time. `quick_init` replaces the generated __init__
with one that calls each slot's own setter, bound once, which takes about
half as long; the class stays a frozen dataclass (assignment after
construction raises, `dataclasses.replace`, `fields` and `asdict` work as
before) and the signature is the dataclass's own (defaults, keyword-only
fields). Only for classes without __post_init__, default factories or
InitVars (refused with a TypeError when applied: the new signature is
checked against the generated one).

`positional` goes one step further for the builder's most frequent object,
the op tag, whose fields are keyword-only: a function that makes an
instance from every field's value in field order, without calling __init__
(keyword arguments cost as much again).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Give a frozen, slotted dataclass a faster __init__ with the same signature (module docstring)."""
    fields = _fields(cls)
    namespace: dict[str, object] = {}
    ordered, keyword = [], []
    for f in fields:
        default = ""
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            default = f"=_default_{f.name}"
        (keyword if f.kw_only else ordered).append(f"{f.name}{default}")
    signature = ", ".join(["self", *ordered, *(["*", *keyword] if keyword else [])])
    init = _compiled(cls, "__init__", signature, "self", namespace)
    if _parameters(init) != _parameters(cls.__init__):  # e.g. an InitVar, which dataclasses.fields leaves out
        raise TypeError(f"quick_init: {cls.__name__}'s __init__ takes arguments that are not its fields")
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls


def positional(cls: type[T]) -> Callable[..., T]:
    """A function making an instance of `cls` (a frozen, slotted dataclass) from all its fields' values, in field
    order, without calling __init__."""
    namespace: dict[str, object] = {"_new": object.__new__, "_cls": cls}
    return _compiled(cls, f"new_{cls.__name__}", ", ".join(f.name for f in _fields(cls)), "_new(_cls)", namespace)


def _parameters(function: Callable) -> list[tuple]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def _fields(cls: type) -> list[dataclasses.Field]:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init: {cls.__name__} has __post_init__, which the fast __init__ would skip")
    fields = list(dataclasses.fields(cls))
    if any(not f.init or f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"quick_init: {cls.__name__} has a field without init or with a default factory")
    return fields


def _compiled(cls: type, name: str, signature: str, instance: str, namespace: dict[str, object]) -> Callable:
    """A function `name`(signature) that sets every slot of `instance` from the argument of its name, through the
    slot's own setter (bound once), and returns the instance when it made it."""
    body = [f"    self = {instance}"] if instance != "self" else []
    for f in dataclasses.fields(cls):
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        body.append(f"    _set_{f.name}(self, {f.name})")
    if instance != "self":
        body.append("    return self")
    source = f"def {name}({signature}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)  # as dataclasses itself writes __init__: from the fields, once per class
    function = namespace[name]
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    return function
