"""What the benches share: where a bench's report goes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional


def emit(text: str, out: Optional[str]) -> int:
    """``text`` on standard output and, with ``out``, in that file too; the bench's exit code (0)."""
    if out:
        Path(out).write_text(text)
    sys.stdout.write(text)
    return 0
