"""``observations.record`` behaves as ``@dataclass(frozen=True)`` does, for the price of fewer compiled methods."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from typing import Any, Callable, Optional

import pytest

from nodehealth.observations.record import record


@record
class Rec:
    """A record."""

    a: int
    b: Optional[int] = None
    c: tuple[int, ...] = dataclasses.field(default_factory=tuple)
    d: str = dataclasses.field(default="", compare=False)
    e: str = dataclasses.field(default="hidden", repr=False)


@dataclasses.dataclass(frozen=True)
class Dc:
    """The same fields as an ordinary frozen dataclass."""

    a: int
    b: Optional[int] = None
    c: tuple[int, ...] = dataclasses.field(default_factory=tuple)
    d: str = dataclasses.field(default="", compare=False)
    e: str = dataclasses.field(default="hidden", repr=False)


def both(make: Callable[[type], Any]) -> tuple[Any, Any]:
    return make(Rec), make(Dc)


def test_repr_eq_hash_are_a_dataclass_s() -> None:
    rec, dc = both(lambda cls: cls(1, c=(2,), d="x"))
    assert repr(rec).replace("Rec", "Dc") == repr(dc) == "Dc(a=1, b=None, c=(2,), d='x')"
    assert rec == Rec(1, None, (2,), "other") and dc == Dc(1, None, (2,), "other")  # d is not compared
    assert rec != Rec(2) and rec != dc and (rec == dc) is False
    assert hash(rec) == hash(Rec(1, c=(2,))) and hash(dc) == hash(Dc(1, c=(2,)))
    calls: list[int] = []

    @record
    class Made:
        x: list[int] = dataclasses.field(default_factory=lambda: calls.append(1) or [])  # type: ignore[func-returns-value]

    assert Made().x is not Made().x and len(calls) == 2  # a factory's value, made per instance


def test_the_dataclass_api_works_on_it() -> None:
    rec = Rec(1, 2)
    assert dataclasses.is_dataclass(rec) and [f.name for f in dataclasses.fields(rec)] == list("abcde")
    assert dataclasses.replace(rec, b=3) == Rec(1, 3)
    assert dataclasses.asdict(rec) == {"a": 1, "b": 2, "c": (), "d": "", "e": "hidden"}
    if sys.version_info >= (3, 10):  # dataclasses gives __match_args__ from 3.10
        assert Rec.__match_args__ == Dc.__match_args__
    assert pickle.loads(pickle.dumps(rec)) == rec
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.a = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "call",
    [
        lambda cls: cls(),
        lambda cls: cls(1, 2, (), "", "", 6),
        lambda cls: cls(1, a=2),
        lambda cls: cls(1, zz=1),
    ],
    ids=["missing", "too many", "twice", "unknown"],
)
def test_wrong_arguments_are_type_errors(call: Callable[[type], Any]) -> None:
    for cls in (Rec, Dc):
        with pytest.raises(TypeError):
            call(cls)


def test_a_frozen_dataclass_may_extend_a_record() -> None:
    @dataclasses.dataclass(frozen=True)
    class More(Rec):
        f: int = 0

    assert (
        repr(More(1, f=3)) == "test_a_frozen_dataclass_may_extend_a_record.<locals>.More(a=1, b=None, c=(), d='', f=3)"
    )


def test_frozen_as_a_frozen_dataclass_is() -> None:
    """Assigning or deleting a field fails as on a frozen dataclass, with the same words; a plain subclass
    may set an attribute of its own, as there; and the methods are shared, not compiled per class."""
    for cls in (Rec, Dc):
        obj = cls(1)
        for act, words in (
            (lambda o: setattr(o, "a", 2), "cannot assign to field 'a'"),
            (lambda o: delattr(o, "b"), "cannot delete field 'b'"),
        ):
            with pytest.raises(dataclasses.FrozenInstanceError, match=words):
                act(obj)
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'other'"):
            obj.other = 1  # type: ignore[attr-defined]
        assert cls.__dataclass_params__.frozen is True

        class Plain(cls):  # type: ignore[valid-type,misc]
            pass

        plain = Plain(1)
        plain.other = 1
        assert plain.other == 1
        with pytest.raises(dataclasses.FrozenInstanceError):
            plain.a = 2
        with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):
            dataclasses.dataclass(type("Loose", (cls,), {"__annotations__": {"f": int}, "f": 0}))

    @record
    class Other:
        x: int = 0

    assert Other.__setattr__.__code__ is Rec.__setattr__.__code__  # shared, not compiled per class
    assert Other.__delattr__.__qualname__.endswith("Other.__delattr__")


def test_a_record_may_extend_a_record_and_not_overwrite_setattr() -> None:
    @record
    class Sub(Rec):
        f: int = 0

    assert Sub(1, f=2) == Sub(1, f=2) and repr(Sub(1)).endswith("Sub(a=1, b=None, c=(), d='', f=0)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sub(1).f = 3  # type: ignore[misc]
    assert Sub.__setattr__.__code__ is Rec.__setattr__.__code__  # a record over records compiles none either
    assert Sub.__dataclass_params__.frozen is True and "frozen=True" in repr(Sub.__dataclass_params__)
    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):
        dataclasses.dataclass(type("Loose", (Sub,), {"__annotations__": {"g": int}, "g": 0}))
    for make in (record, dataclasses.dataclass(frozen=True)):
        with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
            make(type("Own", (), {"__setattr__": lambda self, n, v: None}))


def test_a_record_without_a_docstring_gets_a_dataclass_s_without_inspect(monkeypatch: pytest.MonkeyPatch) -> None:
    """The docstring ``dataclasses`` writes for an undocumented class (its fields' signature), made from
    the fields: ``inspect.signature``, a third of a record's definition, is not called. One given is kept."""
    import inspect

    def body() -> dict[str, Any]:
        return {
            "__annotations__": {"a": "int", "b": "Optional[int]", "c": "tuple[int, ...]", "e": "str"},
            "b": None,
            "c": dataclasses.field(default_factory=tuple),
            "e": dataclasses.field(default="x", init=False),
        }

    plain = dataclasses.dataclass(frozen=True)(type("Bare", (), body()))
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: pytest.fail("inspect.signature called"))
    bare = record(type("Bare", (), body()))
    sub = record(type("Sub", (bare,), {"__annotations__": {"f": "int"}, "f": 0}))
    fields = "a: 'int', b: 'Optional[int]' = None, c: 'tuple[int, ...]' = <factory>"
    assert bare.__doc__ == plain.__doc__ == f"Bare({fields})"
    assert sub.__doc__ == f"Sub({fields}, f: 'int' = 0)"
    assert Rec.__doc__ == "A record."
