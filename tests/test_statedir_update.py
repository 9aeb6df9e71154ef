"""One update for every small JSON state file: the Slurm faces' state and the observe/reboot records
both go through ``files.update_json``, which never stores what their readers refuse (``MAX_READ``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodehealth.statedir import files, layout, records, slurmstate


def test_a_record_over_what_the_reader_reads_is_refused_and_the_old_one_stands(tmp_path: Path) -> None:
    sd = str(tmp_path)
    name = layout.SLURM_OBSERVE
    assert records.update_doc(sd, name, lambda d: {"drain": {"node": "n1", "reason": "nh:x"}}) == {
        "drain": {"node": "n1", "reason": "nh:x"}
    }
    path = Path(layout.path_for(sd, name))
    before = path.read_bytes()
    with pytest.raises(OSError, match="not written"):
        records.update_doc(sd, name, lambda d: {"drain": {"node": "n1", "reason": "x" * files.MAX_READ}})
    assert path.read_bytes() == before
    assert records.read_doc(sd, name) == {"drain": {"node": "n1", "reason": "nh:x"}}


def test_a_record_just_under_the_limit_is_written_and_read_back(tmp_path: Path) -> None:
    sd = str(tmp_path)
    name = layout.REBOOTS
    pad = files.MAX_READ - len(files.dumps({"p": ""}) + "\n") - 1
    doc = records.update_doc(sd, name, lambda d: {"p": "y" * pad})
    assert len(Path(layout.path_for(sd, name)).read_bytes()) < files.MAX_READ
    assert records.read_doc(sd, name) == doc


def test_update_json_reads_strictly_and_says_why_it_starts_afresh(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"a": NaN}\n')
    logged: list[tuple[str, dict[str, Any]]] = []
    seen: list[Any] = []

    def change(raw: Any) -> dict[str, int]:
        seen.append(raw)
        return {"a": 1}

    assert files.update_json(str(p), change, 1.0, log=lambda msg, **kw: logged.append((msg, kw))) == {"a": 1}
    assert seen == [None]
    assert "unusable" in logged[0][0] and logged[0][1] == {"notable": True}
    assert json.loads(p.read_text()) == {"a": 1}
    assert files.update_json(str(p), lambda raw: dict(raw, b=2), 1.0) == {"a": 1, "b": 2}


def test_update_json_encodes_what_it_returns(tmp_path: Path) -> None:
    sd = str(tmp_path)
    got = slurmstate.update(sd, lambda s: s.__class__(clean_runs=2), 1.0)
    assert got is not None and got.clean_runs == 2
    assert json.loads(Path(slurmstate.path(sd)).read_text())["clean_runs"] == 2


def test_both_writers_use_the_one_update() -> None:
    """The guard lives once: neither writer locks, reads or writes the file itself."""
    import inspect

    for fn in (records.update_doc, slurmstate.update):
        src = inspect.getsource(fn)
        assert "files.update_json(" in src, fn
        assert "write_atomic" not in src and "locked(" not in src, fn
