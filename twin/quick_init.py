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
InitVars (refused with a TypeError when applied).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Give a frozen, slotted dataclass a faster __init__ with the same signature (module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init: {cls.__name__} has __post_init__, which the fast __init__ would skip")
    fields = [f for f in dataclasses.fields(cls)]
    if any(not f.init or f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"quick_init: {cls.__name__} has a field without init or with a default factory")
    namespace: dict[str, object] = {}
    positional, keyword, body = [], [], []
    for f in fields:
        default = ""
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            default = f"=_default_{f.name}"
        (keyword if f.kw_only else positional).append(f"{f.name}{default}")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        body.append(f"    _set_{f.name}(self, {f.name})")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)  # as dataclasses itself writes __init__: from the fields, once per class
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls
