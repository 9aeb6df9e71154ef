"""Strict JSON for the state files: what is written and what is believed when read.

Standard library only (``json``), pure (no I/O).

``parse_json`` is strict where ``json.loads`` is not: NaN and Infinity (and ``1e400``, which is
infinity), integers of more than ``MAX_INT_DIGITS`` digits, and nesting deeper than ``MAX_DEPTH``
are refused with a ``ValueError`` that says why, as is a document the C parser runs out of stack
on (``RecursionError``). ``dumps`` never writes a non-finite number (it becomes null).
"""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
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
    kw: dict[str, Any] = {"separators": (",", ":")} if compact else {"indent": 1, "sort_keys": True}
    try:
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False, **kw)


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
