"""``--version``: nodehealth's version and commit, the nvidia-ml-py in use, and the driver when NVML answers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from nodehealth import __version__

DRIVER_TIMEOUT_S = 2.0


def commit() -> Optional[str]:
    """The source commit: the one a package was built from (``nodehealth/_commit.py``, written by
    scripts/stamp-commit.py at build time), else a checkout's .git HEAD (read, no git process), else None."""
    try:
        from nodehealth._commit import COMMIT  # type: ignore[import-not-found,unused-ignore]

        return str(COMMIT)
    except ImportError:
        pass
    root = Path(__file__).resolve().parent.parent.parent
    head = root / ".git" / "HEAD"
    try:
        text = head.read_text(encoding="utf-8").strip()
        if text.startswith("ref: "):
            ref = root / ".git" / text[5:]
            if ref.is_file():
                return ref.read_text(encoding="utf-8").strip()[:12]
            packed = root / ".git" / "packed-refs"
            for line in packed.read_text(encoding="utf-8").splitlines():
                if line.endswith(" " + text[5:]):
                    return line.split()[0][:12]
            return None
        return text[:12]
    except OSError:
        return None


def pynvml_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("nvidia-ml-py")
    except (ImportError, PackageNotFoundError):
        return "not installed"


def driver() -> str:
    """The NVIDIA driver as NVML reports it, read in the probe's killable child under 2 s."""
    from nodehealth.observations import NvmlSnapshot
    from nodehealth.probes import nvml

    res = nvml.start(nvml.load_module, DRIVER_TIMEOUT_S).collect()
    if isinstance(res, NvmlSnapshot) and res.driver_version:
        return f"{res.driver_version} ({res.device_count} GPU(s))"
    return f"not reachable ({res.message if hasattr(res, 'message') else 'no answer'})"


def describe(prog: str = "nodehealth") -> str:
    sha = commit()
    return (
        f"{prog} {__version__}"
        + (f" (commit {sha})" if sha else "")
        + f"\nnvidia-ml-py {pynvml_version()}\nNVIDIA driver: {driver()}"
    )
