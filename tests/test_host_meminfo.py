"""The memory probe reads ``<procfs_root>/meminfo`` itself (psutil only where the file lacks a key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodehealth.observations import MemoryObservation
from nodehealth.probes import host

# A real /proc/meminfo (Linux 6.1, 24 GiB, swap in use), cut to its first lines.
MEMINFO = """\
MemTotal:       24683584 kB
MemFree:         9471804 kB
MemAvailable:   24128880 kB
Buffers:          425460 kB
Cached:         13963276 kB
SwapCached:          512 kB
Active:          5392716 kB
SwapTotal:       2097148 kB
SwapFree:        1048572 kB
Dirty:               520 kB
"""


def test_meminfo_is_read_directly(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO, encoding="ascii")
    assert host.memory(str(tmp_path)) == MemoryObservation(
        total_bytes=24683584 * 1024,
        available_bytes=24128880 * 1024,
        swap_total_bytes=2097148 * 1024,
        swap_used_bytes=(2097148 - 1048572) * 1024,
    )


@pytest.mark.parametrize(
    "text",
    [
        MEMINFO.replace("MemAvailable:   24128880 kB\n", ""),  # Linux before 3.14
        MEMINFO.replace("24683584 kB", "24683584 MB"),
        MEMINFO.replace("24683584", "-1"),
        "",
    ],
    ids=["no MemAvailable", "not kB", "not a number", "empty"],
)
def test_what_meminfo_does_not_say_is_not_made_up(text: str) -> None:
    assert host.parse_meminfo(text) is None


def test_without_the_file_psutil_answers(tmp_path: Path) -> None:
    got = host.memory(str(tmp_path))  # no meminfo here: psutil's reading of this host
    assert isinstance(got, MemoryObservation) and got.total_bytes > 0


def test_this_hosts_meminfo_agrees_with_psutil() -> None:
    psutil = pytest.importorskip("psutil")
    got = host.memory("/proc")
    assert isinstance(got, MemoryObservation)
    assert got.total_bytes == psutil.virtual_memory().total
    assert got.swap_total_bytes == psutil.swap_memory().total
