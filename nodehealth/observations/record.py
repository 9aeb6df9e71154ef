"""``record``: a frozen dataclass that costs about a tenth of ``@dataclass(frozen=True)`` to define.

``dataclasses`` writes each class its own ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it: about a millisecond a class, and
the cold path defines some sixty of them before it judges anything (docs/performance.md, "Import
budget"). ``record`` lets ``dataclasses`` do the rest (fields, defaults, ``fields()``, ``replace()``,
``asdict()``) and gives the six methods as shared functions that read the class's fields, compiling
none, with the same behaviour: positional and keyword arguments, defaults and
``default_factory``, the same ``repr`` (fields with ``repr=False`` left out), ``==`` between two
instances of the very same class over the fields with ``compare=True``, the hash of those, and the
same ``FrozenInstanceError`` on assigning or deleting a field.
A ``@dataclass(frozen=True)`` subclass of a record is an ordinary frozen dataclass.
Standard library only: ``observations`` imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Callable, TypeVar

_T = TypeVar("_T")
_MISSING = dataclasses.MISSING


def _init(cls: type) -> Callable[..., None]:
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields if f.init)
    # name -> (default value or _MISSING, default factory or _MISSING), in field order
    defaults = {f.name: (f.default, f.default_factory) for f in fields}
    later = tuple(f.name for f in fields if not f.init)  # fields set from their default only
    title = cls.__qualname__
    put = object.__setattr__

    def value(name: str) -> Any:
        default, factory = defaults[name]
        if factory is not _MISSING:
            return factory()
        if default is not _MISSING:
            return default
        raise TypeError(f"{title}.__init__() missing 1 required argument: {name!r}")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(names):
            raise TypeError(
                f"{title}.__init__() takes {len(names) + 1} positional arguments but {len(args) + 1} were given"
            )
        for name, arg in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{title}.__init__() got multiple values for argument {name!r}")
            put(self, name, arg)
        for name in names[len(args) :]:
            put(self, name, kwargs.pop(name) if name in kwargs else value(name))
        if kwargs:
            raise TypeError(f"{title}.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")
        for name in later:
            put(self, name, value(name))

    return __init__


def _value_methods(cls: type) -> None:
    fields = dataclasses.fields(cls)
    shown = tuple(f.name for f in fields if f.repr)
    compared = tuple(f.name for f in fields if f.compare)
    hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inner})"

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return tuple(getattr(self, n) for n in compared) == tuple(getattr(other, n) for n in compared)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, n) for n in hashed))

    for name, fn in (("__repr__", __repr__), ("__eq__", __eq__), ("__hash__", __hash__)):
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        setattr(cls, name, fn)


_defining = threading.local()  # .over: True while record defines a class over records in this thread


class _Params:
    """A record's ``__dataclass_params__``: dataclasses' own, read through, with ``frozen`` True, except
    to ``record`` itself while it defines a record over this one in this thread. dataclasses refuses a
    non-frozen class over a frozen base, and a frozen one costs two compiled methods; a record over
    records is defined non-frozen and made frozen after, as a record over no dataclass is."""

    __slots__ = ("_params",)

    def __init__(self, params: Any) -> None:
        self._params = params

    @property
    def frozen(self) -> bool:
        return not getattr(_defining, "over", False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._params, name)

    def __repr__(self) -> str:
        return repr(self._params).replace("frozen=False", "frozen=True")


def _over_records(cls: type) -> bool:
    """Every dataclass among ``cls``'s bases is a record (or there is none)."""
    return all(
        isinstance(base.__dict__.get("__dataclass_params__"), _Params)
        for base in cls.__mro__[1:]
        if "__dataclass_fields__" in base.__dict__
    )


def _frozen(cls: type[Any]) -> None:
    """What ``frozen=True`` writes (``__setattr__``, ``__delattr__``), as shared functions: the same
    FrozenInstanceError for a field or on the class itself, ``super()``'s for another attribute of a
    subclass; and ``__dataclass_params__.frozen``, which ``replace()`` and a frozen subclass read."""
    names = tuple(f.name for f in dataclasses.fields(cls))
    frozen_error = dataclasses.FrozenInstanceError

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise frozen_error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise frozen_error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    for fn in (__setattr__, __delattr__):
        fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
        setattr(cls, fn.__name__, fn)
    cls.__dataclass_params__ = _Params(cls.__dict__["__dataclass_params__"])


def _signature(cls: type) -> str:
    """The docstring ``dataclasses`` gives a class that has none (its ``__init__``'s signature), from
    the fields: ``inspect.signature`` costs a third of a record's definition."""
    params = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        text = f"{f.name}: {f.type!r}"
        if f.default is not _MISSING:
            text += f" = {f.default!r}"
        elif f.default_factory is not _MISSING:
            text += " = <factory>"
        params.append(text)
    return f"{cls.__name__}({', '.join(params)})"


def _record(cls: type[_T]) -> type[_T]:
    undocumented = not cls.__dict__.get("__doc__")
    if undocumented:  # a placeholder, so that dataclasses does not call inspect.signature
        cls.__doc__ = cls.__name__
    plain = _over_records(cls) and not ({"__setattr__", "__delattr__"} & set(cls.__dict__))
    if plain:  # no dataclass base but records, no own __setattr__: frozen without compiling two methods
        before = getattr(_defining, "over", False)
        _defining.over = True
        try:
            made = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
        finally:
            _defining.over = before
        _frozen(made)
    else:  # dataclasses' own checks (a frozen base, an overwritten __setattr__) and methods
        made = dataclasses.dataclass(frozen=True, init=False, repr=False, eq=False)(cls)
    init = _init(made)
    init.__qualname__ = f"{made.__qualname__}.__init__"
    made.__init__ = init  # type: ignore[method-assign]
    _value_methods(made)
    if undocumented:
        made.__doc__ = _signature(made)
    return made


if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    @dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
    def record(cls: type[_T]) -> type[_T]: ...

else:
    record = _record
