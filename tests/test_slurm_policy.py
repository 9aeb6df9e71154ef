"""Slurm policy: node states, ownership, reasons, hysteresis, breaker, state file content."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodehealth.model import Action, CheckResult, Report, Status
from nodehealth.slurm import jobenv, policy, reasons
from nodehealth.slurm import nodes as sn
from nodehealth.statedir import slurmstate

FIX = Path(__file__).parent / "fixtures" / "real-world" / "scontrol"


def report(*results: CheckResult) -> Report:
    return Report(node="n1", phase="healthcheck", results=tuple(results), duration_s=0.1, version="t", started_at=0.0)


def res(name: str, status: Status, summary: str = "x", action: Action = Action.NONE, **details: object) -> CheckResult:
    return CheckResult(name, status, summary, action=action, details=details)


# ----------------------------------------------------------------------------- real recorded output


def _cases() -> list[str]:
    expected = json.loads((FIX / "expected.json").read_text())
    return [k for k in expected if not k.startswith("_")]


@pytest.mark.parametrize("name", _cases())
def test_real_scontrol_output(name: str) -> None:
    expected = json.loads((FIX / "expected.json").read_text())[name]
    nodes = sn.parse_nodes((FIX / name).read_text())
    assert [n.name for n in nodes] == [e["name"] for e in expected["nodes"]]
    for node, exp in zip(nodes, expected["nodes"]):
        assert node.state.text == exp["state"]
        assert node.state.base == exp["base_state"]
        assert node.drained is exp["drained"]
        if exp["reason"] is None:
            assert node.reason is None
        else:
            assert node.reason is not None
            assert node.reason.full == exp["reason"]
            assert node.reason.text == exp["reason_text"]
            assert node.reason.user == exp["reason_user"]
            assert node.reason.time == exp["reason_time"]
            assert not node.reason.ours
        for flag in exp["flags"]:
            assert flag.split(" ")[0] in node.state.flags


def test_real_gres_counts() -> None:
    nodes = {n.name: n for n in sn.parse_nodes((FIX / "irush_slurm1711_four_nodes_one_drained.txt").read_text())}
    assert nodes["cortex-01"].gres_gpus == 8
    assert nodes["dumfries-002"].gres_gpus == 4
    assert nodes["oxygen-04"].gres_gpus is None
    assert nodes["cricket"].gres_gpus == 1


# 22.05 one-line output as captured on the private cluster (shared/notes/slurm-sandbox.md, section 4).
LINE_2205 = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.15 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.1.0 #1 SMP "
    "RealMemory=1000 AllocMem=0 FreeMem=23131 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 "
    "Weight=1 Owner=N/A MCS_label=N/A Partitions=debug BootTime=2026-11-29T20:00:00 "
    "SlurmdStartTime=2026-11-29T21:40:00 LastBusyTime=2026-11-29T21:45:00 CfgTRES=cpu=2,mem=1000M,billing=2 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s{reason}"
)


@pytest.mark.parametrize(
    "state,base,flags,drained",
    [
        ("IDLE", "IDLE", set(), False),
        ("IDLE+DRAIN", "IDLE", {"DRAIN"}, True),
        ("MIXED+DRAIN", "MIXED", {"DRAIN"}, True),
        ("ALLOCATED+DRAIN", "ALLOCATED", {"DRAIN"}, True),
        ("DOWN+NOT_RESPONDING", "DOWN", {"NOT_RESPONDING"}, False),
        ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", {"DRAIN", "NOT_RESPONDING"}, True),
        ("IDLE+NOT_RESPONDING", "IDLE", {"NOT_RESPONDING"}, False),
        ("IDLE+DRAIN+REBOOT_REQUESTED", "IDLE", {"DRAIN", "REBOOT_REQUESTED"}, True),
        ("MIXED+REBOOT_ISSUED", "MIXED", {"REBOOT_ISSUED"}, False),
        ("IDLE+MAINTENANCE+RESERVED", "IDLE", {"MAINTENANCE", "RESERVED"}, False),
        ("UNKNOWN+DRAIN+INVALID_REG", "UNKNOWN", {"DRAIN", "INVALID_REG"}, True),
        ("IDLE+CLOUD+POWERED_DOWN", "IDLE", {"CLOUD", "POWERED_DOWN"}, False),
        ("DRAINED", "IDLE", {"DRAIN"}, True),
        ("DRAINING", "MIXED", {"DRAIN"}, True),
        ("DOWN*", "DOWN", {"NOT_RESPONDING"}, False),
        ("drained", "IDLE", {"DRAIN"}, True),
        ("draining", "MIXED", {"DRAIN"}, True),
        ("drng", "MIXED", {"DRAIN"}, True),
        ("idle~", "IDLE", {"POWERED_DOWN"}, False),
        ("drained*", "IDLE", {"DRAIN", "NOT_RESPONDING"}, True),
        ("mixed@", "MIXED", {"REBOOT_REQUESTED"}, False),
        ("maint", "IDLE", {"MAINTENANCE"}, False),
        ("idle$", "IDLE", {"MAINTENANCE"}, False),
    ],
)
def test_states(state: str, base: str, flags: set[str], drained: bool) -> None:
    st_ = sn.parse_state(state)
    assert st_.base == base.upper() or st_.base == base
    assert set(st_.flags) == flags
    assert st_.drained is drained


def test_2205_one_line_with_our_reason() -> None:
    reason = " Reason=nodehealth: gpu_count: 7 of 8 GPUs [root@2026-11-29T21:45:19]"
    line = LINE_2205.format(state="MIXED+DRAIN", reason=reason)
    (node,) = sn.parse_nodes(line)
    assert node.name == "vm" and node.gres_gpus == 8
    assert node.drained_by_us and not node.drained_by_others
    assert node.reason is not None
    assert node.reason.text == "nodehealth: gpu_count: 7 of 8 GPUs"
    assert node.reason.user == "root"


def test_reason_with_equals_and_brackets_runs_to_end() -> None:
    line = LINE_2205.format(state="IDLE+DRAIN", reason=" Reason=Kill task failed a=b [slurm@2026-11-29T21:45:19]")
    (node,) = sn.parse_nodes(line)
    assert node.reason is not None and node.reason.text == "Kill task failed a=b"
    assert node.drained_by_others


def test_multiple_one_line_records() -> None:
    text = "\n".join(
        LINE_2205.replace("NodeName=vm", f"NodeName=n{i}").format(state="IDLE", reason="") for i in range(3)
    )
    assert [n.name for n in sn.parse_nodes(text)] == ["n0", "n1", "n2"]


# ----------------------------------------------------------------------------- ownership, reasons


@pytest.mark.parametrize(
    "reason,ours",
    [
        ("nh:gpucount gpu_count: 7 of 8", True),
        ("nh:rowremap GPU2 gpu_remapped_rows: GPU 2: row remap pending", True),
        ("nh:xid79 GPU3 gpu_xid: GPU 3: XID 79", True),
        ("nh:mount", True),
        ("  nh:ecc GPU6 x", True),
        ("nh: x", False),
        ("nh:ECC x", False),
        ("nh:ecc: x", False),
        ("nh:9 x", False),
        ("nhx:ecc x", False),
        ("admin: nh:ecc x", False),
        # The shape of the reasons of versions before the codes: a node they drained is still ours.
        ("nodehealth: gpu_count: 7 of 8", True),
        ("  nodehealth: x", True),
        ("Nodehealth: x", False),
        ("admin: nodehealth: x", False),
        ("nodehealth x", False),
        ("Prolog error", False),
        ("Kill task failed", False),
        ("", False),
        (None, False),
    ],
)
def test_ownership(reason: str | None, ours: bool) -> None:
    assert sn.is_ours(reason) is ours


def test_format_reason() -> None:
    r = replace(
        res("gpu_remapped_rows", Status.FAIL, "GPU 3: row remap pending (GPU reset needed)", Action.RESET_GPU), gpu=3
    )
    assert policy.format_reason(r) == "nh:rowremap GPU3 gpu_remapped_rows: GPU 3: row remap pending (GPU reset needed)"
    assert policy.format_reason(r, more=2).endswith("(+2 more)")


@pytest.mark.parametrize(
    "result,head",
    [
        (replace(res("gpu_ecc", Status.FAIL, "GPU 6: 3 uncorrectable", Action.RESET_GPU), gpu=6), "nh:ecc GPU6 "),
        (
            replace(res("gpu_xid", Status.FAIL, "GPU 3 (0000:3b:00.0): XID 79", Action.REBOOT, xid=79), gpu=3),
            "nh:xid79 GPU3 ",
        ),
        (res("gpu_xid", Status.UNKNOWN, "cannot watch XIDs: denied"), "nh:xid "),
        (
            replace(
                res("job_forensics", Status.FAIL, "job 42: GPU 0: XID 48 during the job", Action.REBOOT, xid=48), gpu=0
            ),
            "nh:xid48 GPU0 ",
        ),
        (
            replace(res("job_forensics", Status.FAIL, "job 42: GPU 1: +1 uncorrectable ECC", Action.RESET_GPU), gpu=1),
            "nh:jobecc GPU1 ",
        ),
        (res("gpu_count", Status.FAIL, "7 of 8 GPUs visible", Action.REBOOT), "nh:gpucount "),
        (res("host_mounts", Status.FAIL, "/scratch: not mounted"), "nh:mount "),
        (
            replace(res("gpu_remapped_rows", Status.FAIL, "GPU 12: row remap failed", Action.INSPECT), gpu=12),
            "nh:rowremap GPU12 ",
        ),
        # An XID number only names XID checks; a check's details never make up another code.
        (replace(res("gpu_ecc", Status.FAIL, "GPU 6: x", xid=79), gpu=6), "nh:ecc GPU6 "),
        (res("gpu_xid", Status.FAIL, "x", xid="79; state=resume"), "nh:xid "),
    ],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_reason_starts_with_code_and_gpu_within_sinfo_R_20(result: CheckResult, head: str) -> None:
    text = policy.format_reason(result)
    assert text.startswith(head), text
    assert len(head.rstrip()) <= 20  # what `sinfo -R` shows
    assert sn.is_ours(text)
    assert text == jobenv.sanitize(text)


def test_every_registered_check_has_its_own_code() -> None:
    from nodehealth.registry import CHECKS

    names = {spec.name for spec in CHECKS}
    assert set(reasons.reason_codes()) == names
    codes = [code for code, _ in reasons.reason_codes().values()] + list(reasons.STATE_CODES)
    assert all(re.fullmatch(r"[a-z][a-z0-9]{0,15}", code) for code in codes), codes  # what a code may hold
    assert len(set(codes)) == len(codes) and not any(c.startswith("xid") and c != "xid" for c in codes)
    for name in names:  # the longest head: code, XID number, a two-digit GPU
        head = policy.reason_head(CheckResult(name, Status.FAIL, "x", gpu=15, details={"xid": 154}))
        assert len(head) <= 20 and sn.is_ours(head + " x"), head


# Published codes (tests/golden/reason-codes.txt, "code check" a line): a code never changes meaning
# and is never given to another check, since sites' alert rules and scripts match on it. A new code
# is appended by `pytest tests/test_slurm_policy.py --update-golden`; a published line is never
# rewritten by it.
CODES_GOLDEN = Path(__file__).parent / "golden" / "reason-codes.txt"


def test_published_codes_keep_their_meaning(request: pytest.FixtureRequest) -> None:
    published = dict(line.split() for line in CODES_GOLDEN.read_text().splitlines() if line.strip())
    now = {code: check for check, (code, _) in reasons.reason_codes().items()}
    now.update({code: "-" for code in reasons.STATE_CODES})
    changed = {code: (check, now.get(code)) for code, check in published.items() if now.get(code) != check}
    assert not changed, f"published codes changed or gone (code: (was, now)): {changed}"
    new = sorted(set(now) - set(published))
    if new and request.config.getoption("--update-golden"):
        with CODES_GOLDEN.open("a") as f:
            f.writelines(f"{code} {now[code]}\n" for code in new)
        new = []
    assert not new, f"new codes {new}: pytest tests/test_slurm_policy.py --update-golden, and review the diff"


def test_operations_md_reason_codes_table_is_the_codes() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    section = doc.split("\n## Reason codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `nh:")]
    assert rows == reasons.reason_codes_table()[2:]


def test_an_old_shape_drain_is_still_owned_and_counted() -> None:
    old = "nodehealth: gpu_count: 7 of 8 GPUs visible"
    state = slurmstate.State(drain=slurmstate.DrainRecord(old, "gpu_count", "reboot", "b", 1.0, "healthcheck", None))
    n = node("IDLE+DRAIN", f"{old} [root@2026-11-29T21:45:19]")
    assert policy.owns(n, state) and n.drained_by_us
    assert policy.decide_drain(n, state, FAULT, REASON).action == "none"  # its first reason stays
    assert policy.breaker([n, node("IDLE", None, "me")], 0.25, 1, exclude="me").ours == 1


def test_reason_sanitised_and_capped() -> None:
    nasty = 'GPU 1: "bad"\nstate=resume; rm -rf / `x` $(y) \\ \x00\x1b[31m' + "z" * 500
    text = policy.format_reason(res("gpu_x", Status.FAIL, nasty), limit=120)
    assert len(text) <= 120
    assert text.startswith("nh:gpux gpu_x: GPU 1: bad state")
    for bad in ('"', "'", "\n", "\x00", "\x1b", "`", "$", ";", "=", "\\"):
        assert bad not in text
    assert text.endswith(("...", "(+1 more finding)"))


def test_reason_keeps_whole_findings_and_counts_the_rest() -> None:
    summary = "GPU 0-7: NVLink 1,2 inactive; GPU 3: NVLink 4: 2000 replays; GPU 5: NVLink 9: 90 recoveries"
    text = policy.format_reason(res("gpu_nvlink", Status.FAIL, summary), limit=110)
    assert text == (
        "nh:nvlink gpu_nvlink: GPU 0-7: NVLink 1,2 inactive / GPU 3: NVLink 4: 2000 replays (+1 more finding)"
    )
    whole = policy.format_reason(res("gpu_nvlink", Status.FAIL, summary), limit=200)
    assert whole.endswith("GPU 5: NVLink 9: 90 recoveries") and "..." not in whole


@given(st.text(max_size=600), st.integers(min_value=40, max_value=300))
def test_sanitize_never_breaks_scontrol(text: str, limit: int) -> None:
    out = policy.format_reason(res("c", Status.FAIL, text), limit=limit)
    assert len(out) <= limit
    assert out.startswith("nh:c c:") and sn.is_ours(out)
    assert out == out.strip()
    assert all(ch.isprintable() for ch in out)
    assert not any(ch in out for ch in "\"'`\\$;|&<>=[]")


# ----------------------------------------------------------------------------- decisions


def node(state: str, reason: str | None = None, name: str = "n1") -> sn.NodeInfo:
    return sn.NodeInfo(name=name, state=sn.parse_state(state), reason=sn.parse_reason(reason))


FAULT = res("gpu_count", Status.FAIL, "7 of 8 GPUs visible", Action.REBOOT)
REASON = policy.format_reason(FAULT)


def test_worst_failure_and_unknown_policy() -> None:
    rep = report(res("a", Status.OK), res("b", Status.UNKNOWN), res("c", Status.WARN))
    assert policy.worst_failure(rep, "pass") is None
    assert policy.worst_failure(rep, "fail") is not None
    rep2 = report(res("a", Status.FAIL, action=Action.RESTART_APP), res("b", Status.FAIL, action=Action.INSPECT))
    worst = policy.worst_failure(rep2)
    assert worst is not None and worst.name == "b"
    assert policy.fault_count(rep2) == 2


NO_RECORD = slurmstate.State()


def recorded(reason: str = REASON, action: str = "reboot") -> slurmstate.State:
    return slurmstate.State(
        drain=slurmstate.DrainRecord(
            reason=reason, check="gpu_count", action=action, boot_id="b", time=1.0, phase="epilog", job_id="42"
        )
    )


def test_drain_never_overwrites_other_reasons() -> None:
    for other in (
        "admin maintenance [alice@2026-01-01T00:00:00]",
        "Kill task failed [slurm@now]",
        "Prolog error [root@now]",
        "other-tool: disk [root@now]",
        # starts like ours, but a person wrote or edited it (nothing of ours is recorded, or
        # what is recorded differs): never overwritten
        REASON + " -- investigating, DO NOT RESUME [alice@now]",
        REASON + " [alice@now]",
    ):
        for st_ in (NO_RECORD, recorded(REASON + " (+1 more)")):
            d = policy.decide_drain(node("IDLE+DRAIN", other), st_, FAULT, REASON)
            assert d.action == "none", (other, st_)
    d = policy.decide_drain(node("DOWN+NOT_RESPONDING", "Not responding [slurm@now]"), NO_RECORD, FAULT, REASON)
    assert d.action == "none"


def test_drain_cases() -> None:
    assert policy.decide_drain(node("IDLE"), NO_RECORD, FAULT, REASON).action == "drain"
    assert policy.decide_drain(None, NO_RECORD, FAULT, REASON).action == "drain"
    # ours (exactly what we recorded): the first reason stays for a fault no more severe
    ours = node("MIXED+DRAIN", REASON + " [root@t]")
    assert policy.decide_drain(ours, recorded(), FAULT, REASON).action == "none"
    assert policy.decide_drain(ours, recorded(), FAULT, "nh:ecc gpu_ecc: another fault").action == "none"
    # a more severe fault replaces it
    worse = CheckResult("nvml", Status.FAIL, "NVML did not answer", action=Action.REBOOT)
    worse_reason = "nh:nvml nvml: NVML did not answer"
    assert policy.decide_drain(ours, recorded(action="reset_gpu"), worse, worse_reason).action == "drain"
    # an old reason left on an undrained node is not a drain
    assert policy.decide_drain(node("IDLE", "old admin note [a@t]"), NO_RECORD, FAULT, REASON).action == "drain"


def test_ownership_is_the_recorded_reason_exactly() -> None:
    assert policy.owns(node("IDLE+DRAIN", REASON + " [root@t]"), recorded())
    assert not policy.owns(node("IDLE+DRAIN", REASON + " [root@t]"), NO_RECORD)  # the prefix is not enough
    assert not policy.owns(node("IDLE+DRAIN", REASON + " DO NOT RESUME [alice@t]"), recorded())
    assert not policy.owns(node("IDLE", None), recorded())


def test_slurms_reboot_issued_suffix_keeps_the_drain_ours_only_while_the_reboot_is_issued() -> None:
    issued = REASON + policy.REBOOT_ISSUED_SUFFIX + " [root@t]"
    assert policy.owns(node("DOWN+DRAIN+REBOOT_ISSUED", issued), recorded())
    assert not policy.owns(node("IDLE+DRAIN", issued), recorded())  # no reboot under way: someone's edit
    assert not policy.owns(node("DOWN+DRAIN+REBOOT_ISSUED", REASON + " : reboot timed out [root@t]"), recorded())
    assert not policy.owns(node("DOWN+DRAIN+REBOOT_ISSUED", issued), NO_RECORD)


def drained_state(clean: int, action: str = "reset_gpu", boot: str | None = "boot-a") -> slurmstate.State:
    rec = slurmstate.DrainRecord(
        reason=REASON, check="gpu_count", action=action, boot_id=boot, time=1.0, phase="prolog"
    )
    return slurmstate.State(clean_runs=clean, drain=rec)


def decide(
    me: sn.NodeInfo | None, state: slurmstate.State, needed: int, boot: str | None, reboot: tuple[str, ...]
) -> policy.Decision:
    """decide_resume over resume_due's answer, as slurm.act asks them."""
    return policy.decide_resume(me, state, policy.resume_due(state, needed, boot, reboot))


def test_resume_needs_n_clean_runs() -> None:
    ours = node("IDLE+DRAIN", REASON + " [root@t]")
    assert decide(ours, drained_state(2), 3, "boot-a", ("reboot",)).action == "none"
    assert decide(ours, drained_state(3), 3, "boot-a", ("reboot",)).action == "resume"


def test_resume_never_for_others_or_hands_off() -> None:
    s = drained_state(10)
    assert decide(node("IDLE+DRAIN", "admin [a@t]"), s, 3, "b", ()).action == "none"
    assert decide(node("IDLE", None), s, 3, "b", ()).action == "none"
    assert decide(node("IDLE+DRAIN+REBOOT_REQUESTED", REASON), s, 3, "b", ()).action == "none"
    assert decide(node("IDLE+DRAIN+MAINTENANCE", REASON), s, 3, "b", ()).action == "none"
    assert decide(None, s, 3, "b", ()).action == "none"


def test_reboot_class_needs_new_boot_id() -> None:
    ours = node("IDLE+DRAIN", REASON)
    s = drained_state(5, action="reboot", boot="boot-a")
    assert decide(ours, s, 3, "boot-a", ("reboot",)).action == "none"
    assert decide(ours, s, 3, None, ("reboot",)).action == "none"
    assert decide(ours, s, 3, "boot-b", ("reboot",)).action == "resume"
    # not reboot-class by config: clean runs are enough
    assert decide(ours, s, 3, "boot-a", ("inspect",)).action == "resume"
    # the record was lost (a state dir on tmpfs across the reboot): the reason is no longer
    # provably ours, so it is left for a person
    assert decide(ours, slurmstate.State(clean_runs=3), 3, "boot-a", ("reboot",)).action == "none"


def test_after_run_counter() -> None:
    s = slurmstate.State(clean_runs=2)
    assert policy.after_run(s, report(res("a", Status.WARN)), "pass", 5.0, "b").clean_runs == 3
    assert policy.after_run(s, report(res("a", Status.FAIL)), "pass", 5.0, "b").clean_runs == 0
    assert policy.after_run(s, report(res("a", Status.UNKNOWN)), "pass", 5.0, "b").clean_runs == 2
    assert policy.after_run(s, report(res("a", Status.UNKNOWN)), "fail", 5.0, "b").clean_runs == 0
    assert policy.after_run(s, report(res("a", Status.SKIPPED)), "pass", 5.0, "b").boot_id == "b"


def test_clean_runs_count_only_runs_that_judge_the_drains_check() -> None:
    s = replace(drained_state(1), boot_id="b")
    assert policy.after_run(s, report(res("gpu_count", Status.OK)), "pass", 5.0, "b").clean_runs == 2
    # the drain's check not in this run, SKIPPED, UNKNOWN or only reported: no evidence, count unchanged
    assert policy.after_run(s, report(res("other", Status.OK)), "pass", 5.0, "b").clean_runs == 1
    assert policy.after_run(s, report(res("gpu_count", Status.SKIPPED)), "pass", 5.0, "b").clean_runs == 1
    reported = CheckResult("gpu_count", Status.OK, "seen", details={"judged": False})
    assert policy.after_run(s, report(reported), "pass", 5.0, "b").clean_runs == 1
    # job forensics (epilog only) is judged gone by the checks that see the same faults
    fx = replace(s, drain=replace(s.drain, check="job_forensics"))
    both = report(res("gpu_ecc", Status.OK), res("gpu_remapped_rows", Status.OK), res("gpu_xid", Status.OK))
    assert policy.after_run(fx, both, "pass", 5.0, "b").clean_runs == 2
    assert policy.after_run(fx, report(res("gpu_ecc", Status.OK)), "pass", 5.0, "b").clean_runs == 1


def test_runs_of_an_earlier_boot_never_count() -> None:
    s = replace(drained_state(5), boot_id="boot-a")
    assert policy.after_run(s, report(res("gpu_count", Status.OK)), "pass", 5.0, "boot-b").clean_runs == 1
    assert policy.after_run(s, report(res("gpu_count", Status.OK)), "pass", 5.0, "boot-a").clean_runs == 6


def test_breaker_fails_closed_on_an_empty_cluster_view() -> None:
    br = policy.breaker([], 0.1, 1)
    assert br.tripped and "could not be counted" in br.describe()


def test_breaker() -> None:
    shapes = ("nodehealth: x [root@t]", "nh:x x [root@t]")  # the old shape and the new one
    nodes = [node("IDLE+DRAIN", shapes[i % 2], f"n{i}") for i in range(9)] + [node("IDLE", None, "me")]
    br = policy.breaker(nodes, 0.25, 3, exclude="me")
    assert br.tripped and br.ours == 9 and br.total == 10
    assert "HOLDING" in br.describe()
    assert not policy.breaker(nodes, 0.95, 3, exclude="me").tripped
    assert not policy.breaker(nodes, 0.25, 10, exclude="me").tripped
    # admin drains do not count; neither does this node's own drain
    mixed = [node("IDLE+DRAIN", "admin [a@t]", f"a{i}") for i in range(9)] + [node("IDLE+DRAIN", REASON, "me")]
    assert not policy.breaker(mixed, 0.25, 1, exclude="me").tripped
    assert policy.breaker([], 0.25, 1).tripped  # an empty view cannot be counted: it holds (fails closed)


def test_state_round_trip_and_garbage() -> None:
    s = slurmstate.State(
        clean_runs=4,
        last_status="OK",
        last_run=3.5,
        boot_id="b",
        drain=slurmstate.DrainRecord("nodehealth: x", "x", "reboot", "b", 1.0, "prolog", "12"),
        breaker_held={"ours": 9},
        slurm_node={"name": "n1", "gres_gpus": 8},
    )
    assert slurmstate.State.from_json(json.loads(json.dumps(s.to_json()))) == s
    for junk in (None, [], "x", {"version": 99}, {"version": 1, "clean_runs": "many", "drain": {"nope": 1}}):
        got = slurmstate.State.from_json(junk)
        assert got.clean_runs == 0 and got.drain is None


# ----------------------------------------------------------------------------- job GPUs


@pytest.mark.parametrize(
    "env,gpus",
    [
        ({"SLURM_JOB_GPUS": "0,1"}, (0, 1)),
        ({"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "0"}, (3,)),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, (0, 2)),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8c2f0a1e-0000"}, None),
        ({"SLURM_JOB_GPUS": "$(reboot)"}, None),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
        ({}, None),
    ],
)
def test_job_gpus(env: dict[str, str], gpus: tuple[int, ...] | None) -> None:
    assert jobenv.job_gpus(env) == gpus


def test_scope_processes_to_job_gpus() -> None:
    procs = res(
        "gpu_processes",
        Status.FAIL,
        "GPU 5: 1 compute process(es)",
        Action.RESTART_APP,
        gpus={"5": "GPU 5: 1 compute process(es) (pid 42, 1024 MiB) before/after a job (epilog)"},
    )
    rep = report(procs, res("gpu_ecc", Status.OK))
    other = policy.scope_processes(rep, (0, 1))
    assert other.status == Status.OK
    assert "other jobs" in other.results[0].summary
    mine = policy.scope_processes(rep, (5,))
    assert mine.status == Status.FAIL and mine.results[0].gpu == 5
    assert policy.scope_processes(rep, None).status == Status.FAIL


def test_a_clean_run_clears_a_breaker_hold_a_fault_keeps_it() -> None:
    held = slurmstate.State(breaker_held={"time": 1.0, "reason": REASON})
    assert policy.after_run(held, report(res("gpu_count", Status.OK)), "pass", 5.0, "b").breaker_held is None
    assert policy.after_run(held, report(FAULT), "pass", 5.0, "b").breaker_held is not None


def test_a_check_declares_its_code_in_its_own_module() -> None:
    """The code is read from the check's module (``REASON``), not from a table in the slurm layer."""
    from nodehealth.registry import BY_NAME

    spec = BY_NAME["gpu_temperature"]
    assert spec.reason == spec.module.REASON == ("temp", reasons.reason_codes()["gpu_temperature"][1])
    assert reasons.reason_code("gpu_temperature") == "temp"
    assert not hasattr(sn, "REASON_CODES")  # slurm.nodes, below the registry, holds no copy
