"""Text from the kernel log, made safe to print and bounded.

The kernel log quotes names that users choose (a process name, a file name), and a log read from
a file or from the journal may hold raw control characters. ``printable`` is the one rule for
every piece of such text the XID watch stores or shows (``nodehealth xid scan`` text and JSON,
``xid watch``, the ``gpu_xid`` check's summary and details, the event store, the logs): each
character that is not printable (C0 and C1 controls, ESC and so every terminal escape sequence,
``\\r``, backspace, DEL, bidirectional and zero-width format characters, lone surrogates) is
written as an escape, ``\\x1b`` or ``\\u202e``, the way ``/dev/kmsg`` itself writes them, and the
result is cut at a limit. What comes out holds no character a terminal acts on.

Pure; standard library only.
"""

from __future__ import annotations

from typing import Optional

MAX_MESSAGE_CHARS = 1000  # the driver's text of one event
MAX_PROCESS_CHARS = 64  # the blamed process's name (the kernel's own is at most 15 bytes)
MAX_FIELD_CHARS = 128  # any other short field: a time, a job id, a boot id


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, limit: Optional[int] = MAX_FIELD_CHARS) -> str:
    """``text`` with every non-printable character escaped, at most ``limit`` characters long.

    Printable is ``str.isprintable``: letters, marks, digits, punctuation, symbols and the
    plain space. An escape is never cut in half by the limit. ``limit=None``: no bound.
    """
    if text.isprintable():
        return text if limit is None or len(text) <= limit else text[:limit]
    out: list[str] = []
    size = 0
    for ch in text:
        piece = ch if ch.isprintable() else _escape(ch)
        size += len(piece)
        if limit is not None and size > limit:
            break
        out.append(piece)
    return "".join(out)


def printable_or_none(value: object, limit: Optional[int] = MAX_FIELD_CHARS) -> Optional[str]:
    """``printable(value)`` for a string, None for anything else (a stored field of the wrong type)."""
    return printable(value, limit) if isinstance(value, str) else None
