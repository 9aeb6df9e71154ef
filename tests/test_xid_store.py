"""A poisoned event store (``xid-events.json``): the bad parts are treated as absent, warned
about once, and the next write puts the file back in good form; no value in it gives UNKNOWN
on every run, and none hides the XIDs of this boot's kernel log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers_xid import follow_until_seen, until_seen

from nodehealth.checks import gpu_xid
from nodehealth.checks.base import Context
from nodehealth.model import Status
from nodehealth.observations import Observations
from nodehealth.probes.kernel_log import KmsgReader
from nodehealth.probes.xid_store import MAX_SEQ, XidStore, gather, load_state, store_path

BOOT = "11111111-1111-4111-8111-111111111111"
BTIME = 1_700_000_000
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=train.py, Graphics Exception: ESR 0x50"
GOOD_EVENT = {
    "boot_id": BOOT,
    "at": BTIME + 5.0,
    "recorded_at": BTIME + 6.0,
    "xid": 13,
    "pci": "0000:3b:00",
    "kind": "xid",
    "pid": 4242,
    "process": "train.py",
    "job_id": None,
    "message": "Graphics Exception",
    "time": "5.000000",
    "uptime_s": 5.0,
    "seq": 1,
    "severity": "application",
    "action": "restart_app",
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} in the rewritten store")


def strict(path: Path) -> Any:
    """The file's JSON, refusing NaN and Infinity (what a good store never holds)."""
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)


class Node:
    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT + "\n")
        (self.proc / "stat").write_text(f"btime {BTIME}\n")
        self.kmsg = root / "kmsg"
        self.state = root / "state"
        self.state.mkdir()
        self.path = Path(store_path(str(self.state)))

    def log(self, *messages: str) -> None:
        self.kmsg.write_text("".join(f"4,{i},{i * 1_000_000},-;{m}\n" for i, m in enumerate(messages, 1)))

    def poison(self, text: str) -> None:
        self.path.write_text(text, encoding="utf-8")

    def store(self) -> XidStore:
        return XidStore(str(self.state), str(self.proc), str(self.kmsg), now=lambda: BTIME + 100.0)

    def check(self) -> Any:
        obs = gather(str(self.state), str(self.proc), str(self.kmsg), (), 1000, False, 10.0)
        ctx = Context(name="gpu_xid", phase="prolog", node="n", expected_gpus="auto")
        return gpu_xid.evaluate(Observations(xid=obs), gpu_xid.Settings(), ctx)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path)
    n.log("usb 1-1: new device", XID_79, "eth0: link up")
    return n


def _store(**fields: Any) -> str:
    data = {"format": 1, "boot_id": BOOT, "kmsg_seq": None, "last_clear": None, "dropped": 0, "events": []}
    data.update(fields)
    return json.dumps(data)


POISONED = {
    "events-a-number": _store(events=5),
    "events-an-object": _store(events={"xid": 79}),
    "entries-not-events": _store(
        events=[
            5,
            "x",
            None,
            [1, 2],
            {"xid": "79", "boot_id": BOOT},
            {"xid": 10**30},
            {"xid": True, "boot_id": BOOT},
            GOOD_EVENT,
        ]
    ),
    "nan-and-infinity": _store(last_clear=1.0, events=[GOOD_EVENT])
    .replace('"at": 1700000005.0', '"at": NaN')
    .replace('"uptime_s": 5.0', '"uptime_s": Infinity')
    .replace('"last_clear": 1.0', '"last_clear": -Infinity')
    .replace('"kmsg_seq": null', '"kmsg_seq": Infinity'),
    "deep-nesting": '{"format": 1, "events": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "nesting-inside-an-event": _store(events=[dict(GOOD_EVENT, message="[" * 500 + "]" * 500)]).replace(
        '"message": "' + "[" * 500 + "]" * 500 + '"', '"message": ' + "[" * 500 + "]" * 500
    ),
    "kmsg-seq-1e30": _store(kmsg_seq=10**30),
    "kmsg-seq-negative": _store(kmsg_seq=-5),
    "kmsg-seq-float": _store(kmsg_seq=3.0),
    "kmsg-seq-past-the-log": _store(kmsg_seq=2**63),
    "kmsg-seq-past-the-log-with-its-events": _store(kmsg_seq=2**63, events=[dict(GOOD_EVENT, seq=2, xid=79)]),
    "wrong-types": _store(boot_id=["x"], dropped="many", last_clear="yesterday", kmsg_seq=True),
    "not-an-object": "[1, 2, 3]",
    "truncated": _store(events=[GOOD_EVENT])[:60],
}


@pytest.mark.parametrize("text", list(POISONED.values()), ids=list(POISONED))
def test_a_poisoned_store_is_warned_about_once_rewritten_and_hides_no_xid(node: Node, text: str) -> None:
    node.poison(text)
    first = node.store().sync()
    assert first.complete
    assert [e["xid"] for e in first.state.events if e["seq"] == 2] == [79], "the XID in the log is recorded once"
    assert first.state.kmsg_seq == 3
    assert first.notes, "the bad parts are named"
    good = strict(node.path)  # rewritten: no NaN, no Infinity ...
    assert good["format"] == 1 and good["kmsg_seq"] == 3 and isinstance(good["events"], list)
    assert all(isinstance(e, dict) and set(e) == set(GOOD_EVENT) for e in good["events"])
    assert load_state(str(node.state))[1] == (), "... and in good form: the next read has nothing to say"
    again = node.store().sync()
    assert again.notes == () and again.added == 0, "warned once"
    res = node.check()
    assert res.status == Status.FAIL and "XID 79" in res.summary, res.summary


@pytest.mark.parametrize(
    "text",
    [POISONED["events-a-number"], POISONED["kmsg-seq-past-the-log"]],
    ids=["events-a-number", "kmsg-seq-past-the-log"],
)
def test_the_check_names_what_was_ignored_in_its_details(node: Node, text: str) -> None:
    node.poison(text)
    res = node.check()
    assert res.status == Status.FAIL
    notes = res.details["notes"]
    assert any("ignored what was not valid" in n or "past the end" in n for n in notes), notes


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        pytest.param(10**30, None, id="beyond-64-bits"),
        pytest.param(-5, None, id="negative"),
        pytest.param(3.0, None, id="float"),
        pytest.param(True, None, id="bool"),
        pytest.param("12", None, id="text"),
        pytest.param(MAX_SEQ, MAX_SEQ, id="largest"),
        pytest.param(0, 0, id="zero"),
    ],
)
def test_a_kmsg_seq_that_is_no_sequence_number_is_absent(node: Node, seq: Any, expected: Any) -> None:
    node.poison(_store(kmsg_seq=seq))
    state, notes = load_state(str(node.state))
    assert state.kmsg_seq == expected
    assert bool(notes) == (expected is None)


def test_a_field_that_is_not_valid_is_absent_and_the_event_kept(node: Node) -> None:
    bad = dict(
        GOOD_EVENT,
        at=float("nan"),
        pid=-1,
        pci="GPU 0",
        kind="other",
        seq=2**70,
        severity="fatal",
        process="x" * 500 + "\x1b]0;owned\x07",
        message="\x1b[2J" + "m" * 5000,
        time=["t"],
        job_id=True,
    )
    node.poison(json.dumps({"format": 1, "boot_id": BOOT, "events": [bad]}))
    state, notes = load_state(str(node.state))
    (event,) = state.events
    assert (
        event["at"],
        event["pid"],
        event["pci"],
        event["kind"],
        event["seq"],
        event["severity"],
        event["time"],
        event["job_id"],
    ) == (None, None, None, "xid", None, None, None, None)
    assert event["xid"] == 13 and event["uptime_s"] == 5.0
    assert len(event["process"]) == 64 and "\x1b" not in event["process"]
    assert event["message"].startswith("\\x1b[2J") and len(event["message"]) == 1000
    assert notes and "event field(s)" in notes[0]


def test_a_position_past_the_end_of_the_log_is_read_again_from_its_beginning() -> None:
    """The reader itself: the backlog ended below the saved position, so it starts again."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".kmsg") as fh:
        fh.write("4,1,1000000,-;a\n4,2,2000000,-;" + XID_79 + "\n")
        fh.flush()
        reader = KmsgReader(fh.name, after_seq=2**63)
        lines = list(reader.lines())
        assert [line.split(b";", 1)[1][:4] for line in lines] == [b"a", b"NVRM"]
        assert reader.last_seq == 2 and reader.complete and reader.rewound is not None
        within = KmsgReader(fh.name, after_seq=2)
        assert list(within.lines()) == [] and within.rewound is None, "a position at the end is not rewound"


def test_the_follower_reads_past_a_poisoned_position_and_says_so_once(node: Node) -> None:
    node.poison(_store(kmsg_seq=2**63, events=[dict(GOOD_EVENT, seq=1)]))
    notes: list[str] = []
    seen = follow_until_seen(node.store(), on_note=notes.append)
    assert [r.event.xid for r in seen] == [79]
    assert len(notes) == 1 and "past the end" in notes[0]
    state = load_state(str(node.state))[0]
    assert state.kmsg_seq == 3
    assert sorted(e["seq"] for e in state.events) == [1, 2], "the record already stored is not stored twice"


def test_a_poisoned_store_is_rewritten_even_when_the_log_brings_nothing_new(node: Node) -> None:
    node.log("usb 1-1: new device", "eth0: link up")
    node.poison(_store(kmsg_seq=2, events=5))
    assert node.store().sync().notes
    assert strict(node.path)["events"] == []
    assert node.store().sync().notes == (), "warned once"


def test_the_daemons_follower_logs_what_the_store_ignored(node: Node) -> None:
    from types import SimpleNamespace

    from nodehealth.checks.gpu_xid import XidSettings
    from nodehealth.probes.xid_follower import StoreXidFollower

    node.poison(_store(events=5, kmsg_seq=10**30))
    cfg = SimpleNamespace(
        checks={"gpu_xid": XidSettings(kmsg_path=str(node.kmsg))},
        paths=SimpleNamespace(state_dir=str(node.state), procfs_root=str(node.proc)),
    )
    logged: list[tuple[str, str]] = []
    seen: list[Any] = []
    follower = StoreXidFollower(cfg, lambda message, priority, **_: logged.append((message, priority)))  # type: ignore[arg-type]
    follower.start(seen.append)
    until_seen(seen, follower.stop)
    assert [e.xid for e in seen] == [79]
    warnings = [m for m, p in logged if p == "warning"]
    assert len(warnings) == 1 and "events is a JSON int" in warnings[0] and "kmsg_seq" in warnings[0], logged
