"""Strict JSON for the state files: what is written and what is believed when read.

Standard library only (``json``, imported on first use), pure (no I/O).

``parse_json`` is strict where ``json.loads`` is not: NaN and Infinity (and ``1e400``, which is
infinity), integers of more than ``MAX_INT_DIGITS`` digits, and nesting deeper than ``MAX_DEPTH``
are refused with a ``ValueError`` that says why, as is a document the C parser runs out of stack
on (``RecursionError``). ``dumps`` never writes a non-finite number (it becomes null).

``json`` (and the ``re`` it imports) is imported by the first ``dumps`` or ``parse_json``, not with
this module: the prolog's fast path reads no JSON. What it writes (the ledger's record, a job's
baseline) goes through ``dumps_small``, the same text as ``dumps(obj, compact=True)`` for a value of
plain types (dict with ``str`` keys, list, tuple, ``str``, ``int``, ``float``, ``bool``, None),
encoded here without ``json``. What it reads is the ``marshal`` form a writer keeps beside a JSON
file (``dumps_marshal``: the value as its JSON reads back), believed by ``parse_marshal`` on the same
terms as ``parse_json``: JSON's types only, finite numbers, bounded integers and depth.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    import json
    from typing import Any

MAX_DEPTH = 64  # JSON nested deeper than this is not a state file of ours
MAX_INT_DIGITS = 20  # an integer of more digits (beyond 64 bits) is refused when parsing


def _finite(obj: Any, depth: int = 0) -> Any:
    """``obj`` with every NaN or infinite float replaced by None."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, float):
        return obj if obj - obj == 0.0 else None
    if isinstance(obj, dict):
        return {k: _finite(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v, depth + 1) for v in obj]
    return obj


def dumps(obj: Any, compact: bool = False) -> str:
    """JSON text of ``obj`` with only finite numbers (a NaN or infinity becomes null)."""
    import json

    kw: dict[str, Any] = {"separators": (",", ":")} if compact else {"indent": 1, "sort_keys": True}
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, **kw)


# json's escapes (ensure_ascii): the short ones, every other character below
# 0x20 or above 0x7e as \\uXXXX (a surrogate pair above the BMP).
_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", 8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}


def _string(text: str) -> str:
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for ch in text:
        n = ord(ch)
        if n in _ESCAPES:
            out.append(_ESCAPES[n])
        elif 0x20 <= n < 0x7F:
            out.append(ch)
        elif n < 0x10000:
            out.append(f"\\u{n:04x}")
        else:  # a surrogate pair, as json writes it
            n -= 0x10000
            out.append(f"\\u{0xD800 | (n >> 10):04x}\\u{0xDC00 | (n & 0x3FF):04x}")
    return '"' + "".join(out) + '"'


class _NotSmall(Exception):
    """A value ``_small`` does not encode (another type, a non-finite float, too deep): ``dumps`` does."""


def _small(obj: Any, depth: int) -> str:
    kind = type(obj)
    if kind is str:
        return _string(obj)
    if obj is None:
        return "null"
    if kind is bool:
        return "true" if obj else "false"
    if kind is int:
        return int.__repr__(obj)
    if kind is float:
        if obj - obj != 0.0:
            raise _NotSmall
        return float.__repr__(obj)
    if depth >= MAX_DEPTH:
        raise _NotSmall
    if kind is dict:
        items = []
        for k, v in obj.items():
            if type(k) is not str:
                raise _NotSmall
            items.append(_string(k) + ":" + _small(v, depth + 1))
        return "{" + ",".join(items) + "}"
    if kind is list or kind is tuple:
        return "[" + ",".join(_small(v, depth + 1) for v in obj) + "]"
    raise _NotSmall


def dumps_small(obj: Any) -> str:
    """``dumps(obj, compact=True)``, without importing ``json`` for a small record of plain types
    (the fast path's ledger record and job baseline); anything else is left to ``dumps``."""
    try:
        return _small(obj, 0)
    except _NotSmall:
        return dumps(obj, compact=True)


def dumps_marshal(text: str) -> bytes:
    """The ``marshal`` form of the JSON document ``text`` (as ``parse_json`` reads it), for the fast path."""
    import marshal

    return marshal.dumps(parse_json(text))


_INT_LIMIT = 10**MAX_INT_DIGITS  # what parse_json refuses: more than MAX_INT_DIGITS digits


def _plain(obj: Any, depth: int) -> bool:
    kind = type(obj)
    if kind is str or kind is bool or obj is None:
        return True
    if kind is int:
        return bool(-_INT_LIMIT < obj < _INT_LIMIT)
    if kind is float:
        return bool(obj - obj == 0.0)
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in obj.items())
    if kind is list:
        return all(_plain(v, depth + 1) for v in obj)
    return False


def parse_marshal(data: bytes) -> Any:
    """The value ``dumps_marshal`` wrote, strictly: ``ValueError`` saying why for bytes that are not
    one (truncated, corrupt, another type than JSON has: a tuple, bytes, a code object; NaN,
    infinite numbers, too deep). Hostile bytes raise many kinds in ``marshal``: every one is a
    ``ValueError`` here."""
    import marshal

    try:
        obj = marshal.loads(data)
    except Exception as exc:  # noqa: BLE001 - EOFError, TypeError, ValueError, MemoryError ... on hostile bytes
        raise ValueError(f"not a marshal value ({type(exc).__name__}: {str(exc)[:100]})") from None
    try:
        plain = _plain(obj, 0)
    except RecursionError:
        plain = False
    if not plain:
        raise ValueError("holds what JSON does not (another type, a non-finite number, too deep)")
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf and nan - nan are nan
        raise ValueError(f"{text[:24]} is not a finite number")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer {text[:24]}... out of range")
    return int(text)


_decoder: list[json.JSONDecoder] = []
_SAME_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_SYNTAX = bytes(range(256)).translate(None, b'[]{}"')


def too_deep(data: bytes, limit: int) -> bool:
    """Whether the JSON document ``data`` (already parsed, so well formed) nests deeper than ``limit``.

    At C speed, without walking the parsed value: escaped backslashes and quotes are dropped
    (every quote left delimits a string), then all but brackets and quotes; adjacent quotes go
    (an empty string, or two strings with nothing between them), then what the strings left
    hold. The brackets left, made one kind, lose their innermost pairs each round: a document
    still not empty after ``limit`` rounds is deeper than that.
    """
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    seq = data.translate(_SAME_BRACKETS, _NOT_SYNTAX)
    seq = seq.replace(b'""', b"")
    if b'"' in seq:
        seq = b"".join(seq.split(b'"')[::2])
    for _ in range(limit):
        if not seq:
            return False
        seq = seq.replace(b"[]", b"")
    return bool(seq)


def parse_json(data: Any, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``data`` (bytes or str), strictly: ``ValueError`` saying why for text
    that is not JSON, NaN or infinite numbers, integers of more than ``MAX_INT_DIGITS`` digits,
    or nesting deeper than ``max_depth``."""
    if not _decoder:
        import json

        _decoder.append(
            json.JSONDecoder(parse_float=_finite_float, parse_int=_bounded_int, parse_constant=_no_constant)
        )
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    try:
        obj = _decoder[0].decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if len(text) > 2 * max_depth:  # shorter text cannot nest deeper
        raw = data if isinstance(data, (bytes, bytearray)) else text.encode("utf-8")
        if too_deep(bytes(raw), max_depth):
            raise ValueError(f"nested deeper than {max_depth} levels")
    return obj
