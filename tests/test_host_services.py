"""host_services: the services probe against fake sysfs trees and systemctl doubles, the check as tables.

The trees are built from published lspci output and the systemctl answers from published forms
(tests/fixtures/host/services/README.md). Nothing here reads the host's sysfs or runs its systemctl.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodehealth.checks import host_services
from nodehealth.checks.base import Context
from nodehealth.model import Action, Status
from nodehealth.observations import Observations, ProbeError
from nodehealth.observations.services import ModuleState, ServicesObservation, UnitState
from nodehealth.platform import proc
from nodehealth.probes import services

FIXTURES = Path(__file__).parent / "fixtures" / "host" / "services"
ROOT = Path(__file__).resolve().parent.parent
FM, PD, IMEX = host_services.FABRICMANAGER, host_services.PERSISTENCED, host_services.IMEX
PEERMEM = host_services.PEERMEM
_LSPCI = re.compile(
    r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]) .*\[([0-9a-f]{4})\]: .*\[([0-9a-f]{4}):([0-9a-f]{4})\]"
)


def pci_tree(sysfs: Path, lspci: str) -> Path:
    """``bus/pci/devices/<addr>/{vendor,device,class}`` as sysfs writes them, from ``lspci -nn`` lines."""
    for line in (FIXTURES / lspci).read_text().splitlines():
        m = _LSPCI.match(line)
        assert m, line
        domain, addr, klass, vendor, device = m.groups()
        d = sysfs / "bus" / "pci" / "devices" / f"{domain or '0000'}:{addr}"
        d.mkdir(parents=True)
        (d / "vendor").write_text(f"0x{vendor}\n")
        (d / "device").write_text(f"0x{device}\n")
        (d / "class").write_text(f"0x{klass}00\n")
    return sysfs


def module(sysfs: Path, name: str, initstate: str | None = "live") -> None:
    d = sysfs / "module" / name
    d.mkdir(parents=True)
    if initstate is not None:
        (d / "initstate").write_text(initstate + "\n")


def answer(stdout: str = "", code: int = 0, **kw: Any) -> Any:
    calls: list[list[str]] = []

    def run(argv: list[str], timeout_s: float, **kwargs: Any) -> proc.CommandResult:
        calls.append(list(argv))
        return proc.CommandResult(tuple(argv), code, stdout, kw.get("stderr", ""), kw.get("timed_out", False))

    run.calls = calls  # type: ignore[attr-defined]
    return run


# --------------------------------------------------------------------------- parsing systemctl show


def test_parse_show_published_forms_one_state_per_unit_in_order() -> None:
    units = [FM, PD, IMEX, "nvidia-dcgm.service"]
    got = services.parse_show((FIXTURES / "systemctl-show.txt").read_text(), units)
    assert isinstance(got, tuple)
    assert [u.name for u in got] == units
    assert got[0] == UnitState(FM, "loaded", "failed", "failed", "enabled", "start-limit-hit", 0)
    assert (got[1].active_state, got[1].sub_state) == ("active", "running")
    assert (got[2].load_state, got[2].unit_file_state) == ("not-found", "")
    assert (got[3].unit_file_state, got[3].result) == ("disabled", "exit-code")


def test_parse_show_real_systemd_252_properties_in_its_own_order() -> None:
    """A real systemd prints Result and NRestarts before Id (systemctl-show-systemd252.txt)."""
    units = [FM, PD, IMEX, "nvidia-dcgm.service", "nvidia-peermem.service"]
    got = services.parse_show((FIXTURES / "systemctl-show-systemd252.txt").read_text(), units)
    assert isinstance(got, tuple) and [u.name for u in got] == units
    assert got[0] == UnitState(FM, "loaded", "failed", "failed", "enabled", "exit-code", 0)
    assert (got[1].active_state, got[1].sub_state, got[1].unit_file_state) == ("active", "running", "disabled")
    assert (got[2].active_state, got[2].sub_state, got[2].result) == ("activating", "auto-restart", "exit-code")
    assert got[2].restarts > 0 and got[3].restarts == 5 and got[3].active_state == "failed"
    assert (got[4].load_state, got[4].unit_file_state) == ("not-found", "")


@pytest.mark.parametrize(
    "text, why",
    [
        ("LoadState=loaded\nActiveState=active\n", "answered 1 unit(s) for the 2 asked"),
        ("LoadState=loaded\nActiveState=active\n\nnot a property line\n", "not Key=Value"),
        ("LoadState=loaded\n\nLoadState=loaded\nActiveState=active\n", "no LoadState/ActiveState"),
        ("", "answered 0 unit(s)"),
    ],
    ids=["fewer-blocks", "garbage-line", "missing-active-state", "empty"],
)
def test_parse_show_refuses_what_systemctl_does_not_write(text: str, why: str) -> None:
    got = services.parse_show(text, [FM, PD])
    assert isinstance(got, str) and why in got


def test_parse_show_hostile_values_become_unknown_never_active() -> None:
    text = f"LoadState=loaded\nActiveState=active running\nSubState={'x' * 5000}\nUnitFileState=enabled\x1b[0m\n"
    (got,) = services.parse_show(text, [FM])  # type: ignore[misc]
    assert (got.load_state, got.active_state, got.sub_state, got.unit_file_state) == ("loaded", None, None, None)
    res = judge(obs(units=(got,), nvswitches=4), fabricmanager="required")
    assert res.status == Status.UNKNOWN and "not understood" in res.summary


# --------------------------------------------------------------------------- sysfs: PCI, RDMA, modules


def test_pci_inventory_hgx_h100_counts_gpus_and_nvswitches(tmp_path: Path) -> None:
    assert services.pci_inventory(str(pci_tree(tmp_path, "lspci-hgx-h100.txt"))) == (8, 4, None)


def test_pci_inventory_pcie_node_and_chipset_bridge_are_not_nvswitches(tmp_path: Path) -> None:
    assert services.pci_inventory(str(pci_tree(tmp_path / "a", "lspci-pcie-t4.txt"))) == (1, 0, None)
    assert services.pci_inventory(str(pci_tree(tmp_path / "b", "lspci-nforce-mcp61.txt"))) == (0, 0, None)


def test_pci_inventory_no_bus_is_no_device_an_unreadable_one_is_an_error(tmp_path: Path) -> None:
    assert services.pci_inventory(str(tmp_path)) == (0, 0, None)
    (tmp_path / "bus" / "pci").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices").write_text("not a directory")
    gpus, switches, error = services.pci_inventory(str(tmp_path))
    assert (gpus, switches) == (None, None) and error


def test_pci_inventory_huge_vendor_file_is_read_bounded(tmp_path: Path) -> None:
    d = tmp_path / "bus" / "pci" / "devices" / "0000:07:00.0"
    d.mkdir(parents=True)
    (d / "vendor").write_text("0x10de" + "0" * (1 << 20))
    (d / "class").write_text("0x068000\n")
    (d / "device").write_text("0x22a3\n")
    assert services.pci_inventory(str(tmp_path)) == (0, 0, None)  # not "0x10de": not NVIDIA's


def test_module_states_live_builtin_missing_and_refused(tmp_path: Path) -> None:
    module(tmp_path, "nvidia_peermem")
    module(tmp_path, "nvidia_uvm", initstate=None)  # built in: no initstate
    module(tmp_path, "going_away", "going")
    module(tmp_path, "odd", "Live; rm -rf /" * 10)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "module" / "linked")
    os.mkfifo(tmp_path / "module" / "odd" / "fifo")
    got = {m: services.module_state(str(tmp_path), m) for m in ("nvidia-peermem", "nvidia_uvm", "going_away")}
    assert got["nvidia-peermem"] == ModuleState("nvidia_peermem", True)
    assert got["nvidia_uvm"].loaded is True and got["going_away"].loaded is False
    assert services.module_state(str(tmp_path), "absent").loaded is False
    assert services.module_state(str(tmp_path), "odd").loaded is None
    linked = services.module_state(str(tmp_path), "linked")
    assert linked.loaded is None and "not a directory" in (linked.detail or "")
    assert services.module_state(str(tmp_path), "../etc").loaded is None


def test_module_initstate_fifo_does_not_block(tmp_path: Path) -> None:
    (tmp_path / "module" / "stuck").mkdir(parents=True)
    os.mkfifo(tmp_path / "module" / "stuck" / "initstate")
    got = services.module_state(str(tmp_path), "stuck")  # O_NONBLOCK: no writer, an empty read
    assert got.loaded is None and "unexpected" in (got.detail or "")


def test_rdma_devices(tmp_path: Path) -> None:
    assert services.rdma_devices(str(tmp_path)) == 0
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    (tmp_path / "class" / "infiniband" / "mlx5_1").mkdir()
    assert services.rdma_devices(str(tmp_path)) == 2


# --------------------------------------------------------------------------- systemctl through the runner


def test_unit_states_argv_ends_options_before_the_units() -> None:
    run = answer((FIXTURES / "systemctl-show.txt").read_text())
    got = services.unit_states([FM, PD, IMEX, "nvidia-dcgm.service"], 2.0, "/usr/bin/systemctl", run)
    assert isinstance(got, tuple) and len(got) == 4
    (argv,) = run.calls
    assert argv[:3] == ["/usr/bin/systemctl", "show", "--no-pager"]
    assert argv[3].startswith("--property=LoadState,") or argv[3].startswith("--property=Id,")
    assert argv[4] == "--" and argv[5:] == [FM, PD, IMEX, "nvidia-dcgm.service"]


@pytest.mark.parametrize("name", ["-H.service", "--root=/tmp", "x", "a b.service", "../../x.service", ""])
def test_unit_states_refuses_names_that_are_not_units(name: str) -> None:
    run = answer()
    got = services.unit_states([name], 2.0, "/usr/bin/systemctl", run)
    assert isinstance(got, str) and "not a unit name" in got and not run.calls


@pytest.mark.parametrize(
    "run, why",
    [
        (
            answer(code=1, stderr="System has not been booted with systemd as init system (PID 1). Can't operate.\n"),
            "exited 1",
        ),
        (answer(timed_out=True), "did not answer within 2 s"),
    ],
    ids=["exit-1", "timed-out"],
)
def test_unit_states_failures_are_reasons(run: Any, why: str) -> None:
    got = services.unit_states([FM], 2.0, "/usr/bin/systemctl", run)
    assert isinstance(got, str) and why in got


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "systemctl"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_hung_systemctl_is_bounded_by_the_deadline(tmp_path: Path) -> None:
    got = services.unit_states([FM], 0.5, _script(tmp_path, "exec sleep 600"))
    assert isinstance(got, str) and "did not answer within 0.5 s" in got


def test_a_systemctl_printing_without_end_is_cut_and_refused(tmp_path: Path) -> None:
    got = services.unit_states([FM], 30.0, _script(tmp_path, "exec yes LoadState=loaded"))
    assert isinstance(got, str) and "more than" in got


def test_a_relative_or_missing_systemctl_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    assert "cannot run systemctl" in str(services.unit_states([FM], 1.0, "systemctl"))
    assert "cannot run systemctl" in str(services.unit_states([FM], 1.0, str(tmp_path / "none")))


def test_systemctl_gets_no_environment_of_the_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    monkeypatch.setenv("SYSTEMD_PAGER", "/tmp/evil")
    out = tmp_path / "env.txt"
    script = _script(tmp_path, f"env > {out}\nprintf 'LoadState=loaded\\nActiveState=active\\n'")
    assert isinstance(services.unit_states([FM], 10.0, script), tuple)
    env = out.read_text()
    assert "LD_PRELOAD" not in env and "SYSTEMD_PAGER" not in env


def test_gather_asks_gpu_units_only_on_a_node_with_nvidia_devices(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-systemd"
    run_dir.mkdir()
    run = answer("LoadState=loaded\nActiveState=active\n")
    got = services.gather(
        str(tmp_path / "sys"), [FM, PD], ["munge.service"], [], 2.0, systemd_dir=str(run_dir), run=run
    )
    assert isinstance(got, ServicesObservation) and (got.nvidia_gpus, got.nvswitches) == (0, 0)
    assert [c[5:] for c in run.calls] == [["munge.service"]]
    run = answer((FIXTURES / "systemctl-show.txt").read_text())
    sysfs = pci_tree(tmp_path / "hgx", "lspci-hgx-h100.txt")
    got = services.gather(str(sysfs), [FM, PD, IMEX], ["nvidia-dcgm.service"], ["nvidia_peermem"], 2.0,
                          systemd_dir=str(run_dir), run=run)  # fmt: skip
    assert isinstance(got, ServicesObservation) and got.nvswitches == 4 and len(got.units) == 4
    assert got.module("nvidia_peermem") == ModuleState("nvidia_peermem", False)


def test_gather_without_systemd_starts_no_program(tmp_path: Path) -> None:
    run = answer()
    sysfs = pci_tree(tmp_path / "hgx", "lspci-hgx-h100.txt")
    got = services.gather(str(sysfs), [FM], [], [], 2.0, systemd_dir=str(tmp_path / "absent"), run=run)
    assert isinstance(got, ServicesObservation) and not got.systemd and not run.calls


# --------------------------------------------------------------------------- the check


def ctx() -> Context:
    return Context(name="host_services", phase="manual", node="gpu001", expected_gpus=8)


def obs(**kw: Any) -> ServicesObservation:
    base: dict[str, Any] = {"nvidia_gpus": 8, "nvswitches": 0, "rdma_devices": 0, "systemd": True}
    base.update(kw)
    if base["systemd"] and not base.get("units_error"):
        # What systemctl says of a GPU unit the case does not name: no such unit.
        given = {u.name for u in base.get("units", ())}
        missing = [unit(n, "inactive", "dead", "", load="not-found") for n in (FM, PD, IMEX) if n not in given]
        base["units"] = (*base.get("units", ()), *missing)
    return ServicesObservation(**base)


def unit(name: str, active: str = "active", sub: str = "running", file: str = "enabled", **kw: Any) -> UnitState:
    return UnitState(name, kw.pop("load", "loaded"), active, sub, file, kw.pop("result", "success"), 0)


def judge(seen: Any, **settings: Any) -> Any:
    return host_services.evaluate(Observations(services=seen), host_services.Settings(**settings), ctx())


HGX = {"nvswitches": 4}
CHECK_CASES: list[tuple[str, dict[str, Any], dict[str, Any], Status, str]] = [
    ("hgx-all-running", {**HGX, "units": (unit(FM), unit(PD))}, {}, Status.OK, "2 needed"),
    ("hgx-fm-failed", {**HGX, "units": (unit(FM, "failed", "failed", result="start-limit-hit"),)}, {}, Status.FAIL,
     f"{FM} failed (start-limit-hit): journalctl -b -u {FM}; systemctl restart {FM}"),
    ("hgx-fm-not-installed", {**HGX, "units": (unit(FM, "inactive", "dead", "", load="not-found"),)}, {}, Status.FAIL,
     f"{FM} is not installed"),
    ("hgx-fm-stopped-disabled", {**HGX, "units": (unit(FM, "inactive", "dead", "disabled"),)}, {}, Status.FAIL,
     f"systemctl enable --now {FM}"),
    ("hgx-fm-stopped", {**HGX, "units": (unit(FM, "inactive", "dead"),)}, {}, Status.FAIL, f"systemctl start {FM}"),
    ("hgx-fm-crash-loop", {**HGX, "units": (unit(FM, "activating", "auto-restart", result="exit-code"),)}, {},
     Status.FAIL, "keeps failing and restarting"),
    ("hgx-fm-starting", {**HGX, "units": (unit(FM, "activating", "start"),)}, {}, Status.WARN, "is starting"),
    ("hgx-fm-masked", {**HGX, "units": (unit(FM, "inactive", "dead", "masked", load="masked"),)}, {}, Status.FAIL,
     f"systemctl unmask {FM}"),
    # A PCIe node whose image enabled Fabric Manager, which fails there: never a drain.
    ("pcie-fm-failed-not-judged", {"units": (unit(FM, "failed", "failed"),)}, {}, Status.SKIPPED, "no NVSwitch"),
    ("pcie-fm-required-by-site", {"units": (unit(FM, "failed", "failed"),)}, {"fabricmanager": "required"},
     Status.FAIL, f"{FM} failed"),
    ("hgx-fm-off", {**HGX, "units": (unit(FM, "failed", "failed"),)}, {"fabricmanager": "off"}, Status.SKIPPED, ""),
    ("no-nvidia-device", {"nvidia_gpus": 0, "units": ()}, {}, Status.SKIPPED, "no NVIDIA device on the PCI bus"),
    ("persistenced-enabled-failed", {"units": (unit(PD, "failed", "failed", result="exit-code"),)}, {}, Status.FAIL,
     f"{PD} failed (exit-code)"),
    ("persistenced-disabled", {"units": (unit(PD, "inactive", "dead", "disabled"),)}, {}, Status.SKIPPED,
     "not enabled"),
    ("imex-not-installed-enabled-mode", {"units": (unit(IMEX, "inactive", "dead", "", load="not-found"),)}, {},
     Status.SKIPPED, ""),
    ("imex-required-stopped", {"units": (unit(IMEX, "inactive", "dead"),)}, {"imex": "required"}, Status.FAIL,
     f"{IMEX} is not running"),
    ("required-without-systemd", {**HGX, "systemd": False}, {}, Status.UNKNOWN, "systemd is not running here"),
    ("enabled-mode-without-systemd", {"systemd": False}, {}, Status.SKIPPED, ""),
    ("systemctl-failed", {**HGX, "units_error": "systemctl show did not answer within 5 s"}, {}, Status.UNKNOWN,
     "did not answer"),
    ("peermem-missing-with-ib", {"rdma_devices": 2, "modules": (ModuleState("nvidia_peermem", False),)}, {},
     Status.WARN, "modprobe nvidia_peermem"),
    ("peermem-required", {"rdma_devices": 2, "modules": (ModuleState("nvidia_peermem", False),)},
     {"peermem": "required"}, Status.FAIL, "modprobe nvidia_peermem"),
    ("peermem-loaded", {"rdma_devices": 2, "modules": (ModuleState("nvidia_peermem", True),)}, {}, Status.OK,
     "nvidia_peermem"),
    ("peermem-rdma-unreadable", {"rdma_devices": None, "modules": (ModuleState("nvidia_peermem", False),)}, {},
     Status.UNKNOWN, "RDMA"),
    ("peermem-symlinked-module", {"rdma_devices": 1, "modules": (ModuleState("nvidia_peermem", None, "is a link"),)},
     {}, Status.UNKNOWN, "cannot tell"),
    ("site-unit-and-module", {"nvidia_gpus": 0, "units": (unit("munge.service", "failed", "failed"),),
     "modules": (ModuleState("nvidia_uvm", False),)}, {"units": ("munge.service",), "modules": ("nvidia-uvm",)},
     Status.FAIL, "module nvidia_uvm not loaded: modprobe nvidia_uvm"),
    ("pci-unreadable", {"nvidia_gpus": None, "nvswitches": None, "pci_error": "/sys/bus/pci/devices: EIO"}, {},
     Status.UNKNOWN, "cannot tell which services"),
]  # fmt: skip


@pytest.mark.parametrize(
    "seen, settings, status, summary", [c[1:] for c in CHECK_CASES], ids=[c[0] for c in CHECK_CASES]
)
def test_host_services(seen: dict[str, Any], settings: dict[str, Any], status: Status, summary: str) -> None:
    res = judge(obs(**seen), **settings)
    assert res.status == status, res.summary
    assert summary in res.summary
    assert res.action == Action.NONE  # a service to start, never the hardware


def test_probe_error_and_not_probed_are_unknown() -> None:
    assert judge(ProbeError("services", "timeout", "services probe did not finish")).status == Status.UNKNOWN
    assert judge(None).status == Status.UNKNOWN


def test_details_say_why_each_unit_was_judged() -> None:
    res = judge(obs(nvswitches=4, units=(unit(FM), unit(PD, "inactive", "dead", "disabled"))))
    assert res.details["judged"][FM]["why"] == "4 NVSwitch(es) on the PCI bus"
    assert PD in res.details["not_needed"] and res.details["nvswitches"] == 4
    json.dumps(res.details)


@pytest.mark.parametrize(
    "settings",
    [{"units": ("-H.service",)}, {"units": ("x",)}, {"modules": ("../x",)}, {"systemctl": "systemctl"}],
    ids=["option-unit", "no-suffix", "path-module", "relative-systemctl"],
)
def test_settings_refuse_what_argv_or_sysfs_must_not_carry(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        host_services.Settings(**settings).validate()


# --------------------------------------------------------------------------- end to end: config, runner, probe


def _check_hgx(tmp_path: Path, fixture: str, lines: int, extra: str = "") -> dict[str, Any]:
    """`nodehealth check --only host_services` on an HGX H100 tree, systemctl a double printing the first
    ``lines`` lines of ``fixture`` (the units asked, in the order asked); the check's JSON result."""
    sysfs = pci_tree(tmp_path / "sys", "lspci-hgx-h100.txt")
    run_dir = tmp_path / "run-systemd"
    run_dir.mkdir()
    script = _script(tmp_path, f"head -n {lines} {FIXTURES / fixture}")
    cfg = tmp_path / "nodehealth.toml"
    cfg.write_text(
        f'[paths]\nsysfs_root = "{sysfs}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[checks.host_services]\nsystemctl = "{script}"\nsystemd_run_dir = "{run_dir}"\n' + extra
    )
    env = dict(os.environ, NO_COLOR="1")
    env.pop("NODEHEALTH_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "nodehealth", "check", "--config", str(cfg), "--only", "host_services",
         "--format", "json"],
        capture_output=True, text=True, env=env, cwd=ROOT, check=False, timeout=120,
    )  # fmt: skip
    (res,) = json.loads(done.stdout)["checks"]
    return dict(res)


def test_check_command_judges_an_hgx_tree_with_a_failed_fabric_manager(tmp_path: Path) -> None:
    # The double answers for the three GPU units in the order asked (the fixture's first three blocks).
    res = _check_hgx(tmp_path, "systemctl-show.txt", 23)
    assert res["status"] == "FAIL", res
    assert f"{FM} failed (start-limit-hit)" in res["summary"] and res["details"]["nvswitches"] == 4


def test_a_node_with_nothing_to_ask_imports_no_subprocess_runner(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom nodehealth.probes import services\n"
        f"seen = services.gather({str(tmp_path)!r}, ['nvidia-fabricmanager.service'], [], ['nvidia_peermem'], 1.0)\n"
        "print(seen.nvidia_gpus, 'nodehealth.platform.proc' in sys.modules, 'subprocess' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False, timeout=120
    )
    assert done.stdout.split() == ["0", "False", "False"], done.stderr


def test_the_metric_names_only_what_is_down() -> None:
    from nodehealth.metrics.exposition import render
    from nodehealth.metrics.renderers import services_families
    from nodehealth.model import Report

    res = judge(obs(nvswitches=4, units=(unit(FM, "failed", "failed"), unit(PD))))
    text = render(services_families(Report("gpu001", "daemon", (res,), 0.0, "X", 0.0))).decode()
    assert f'nodehealth_host_service_down{{name="{FM}"}} 1' in text
    assert PD not in text  # running: quiet, no series


def test_per_host_override_demands_fabric_manager_on_one_node_type(tmp_path: Path) -> None:
    """GB200 compute trays see no NVSwitch on their PCI bus: the site names them in an [[override]]."""
    from nodehealth.config import loader

    cfg = tmp_path / "nodehealth.toml"
    cfg.write_text(
        '[checks.host_services]\npeermem = "required"\n'
        '[[override]]\nhosts = "gb[001-018]"\nchecks.host_services.fabricmanager = "required"\n'
        'checks.host_services.units = ["nvidia-dcgm.service"]\n'
    )
    tray, other = loader.load(str(cfg), host="gb007"), loader.load(str(cfg), host="gpu001")
    mine, theirs = tray.checks["host_services"], other.checks["host_services"]
    assert (mine.fabricmanager, mine.units, mine.peermem) == ("required", ("nvidia-dcgm.service",), "required")  # type: ignore[attr-defined]
    assert (theirs.fabricmanager, theirs.units) == ("auto", ())  # type: ignore[attr-defined]
    seen = obs(units=(unit(FM, "inactive", "dead"), unit("nvidia-dcgm.service")), modules=(ModuleState(PEERMEM, True),))
    assert host_services.evaluate(Observations(services=seen), mine, ctx()).status == Status.FAIL  # type: ignore[arg-type]
    assert host_services.evaluate(Observations(services=seen), theirs, ctx()).status == Status.OK  # type: ignore[arg-type]


def test_a_bad_unit_name_in_the_config_is_an_error_that_names_the_key(tmp_path: Path) -> None:
    from nodehealth.config import loader

    cfg = tmp_path / "nodehealth.toml"
    cfg.write_text('[checks.host_services]\nunits = ["--root=/tmp/x"]\n')
    with pytest.raises(Exception, match="units"):
        loader.load(str(cfg), host="gpu001")


def test_real_systemd_252_answers_judged_end_to_end(tmp_path: Path) -> None:
    """systemd 252's own `systemctl show` (systemctl-show-systemd252.txt: it prints Result and NRestarts
    before Id, whatever --property's order) for a failed, a running, a restarting and a start-limited unit."""
    extra = 'persistenced = "required"\nimex = "required"\nunits = ["nvidia-dcgm.service"]\n'
    res = _check_hgx(tmp_path, "systemctl-show-systemd252.txt", 31, extra)  # four units asked, not peermem's
    assert res["status"] == "FAIL", res
    text = json.dumps(res)
    assert f"{FM} failed (exit-code): journalctl -b -u {FM}" in text, text
    assert f"{IMEX} keeps failing and restarting (exit-code)" in text, text
    assert "nvidia-dcgm.service failed (exit-code)" in text, text
    assert f"{PD} " not in res["summary"], res["summary"]  # the running one is not a finding
