"""NCCL self-test: a local all-reduce across the node's GPUs at its bandwidth floor, the right transport.

One run per configured mode (``nvlink``: every path allowed; ``ib_loopback``: P2P and SHM off,
the traffic through the node's NICs), judged on what the NCCL parsers read from its output:

* the bus bandwidth of the largest size against the floor of this GPU model, GPU count and mode
  (``nodehealth/data/nccl_floors.toml``, or the node's own ``<mode>_floor_gbps``): FAIL under
  ``fail_fraction`` of it, WARN under ``warn_fraction`` (action inspect);
* ``#wrong`` > 0: FAIL (wrong results: inspect);
* NCCL's WARN and error lines: FAIL when NCCL gave up (``fatal``), else WARN;
* the transport: with ``require_ib``, IB loopback that went over ``NET/Socket`` is a FAIL naming
  it; in NVLink mode P2P/SHM/NVLS is what is expected;
* the run itself: killed at the deadline (hung: reboot), killed by a signal (crashed: reboot), an
  exit status other than 0, or nothing printed with status 0: FAIL saying which; output past the
  cap (``nccl.runner.MAX_OUTPUT``, the runner killed there) is UNKNOWN: nothing left to judge.

A runner that is not installed is SKIPPED; one configured wrong (a path that is not there, not
root's, arguments it rejects) is UNKNOWN, and output the parser cannot read is UNKNOWN: nothing
drains a healthy node over a bad config or a parser that does not know an output.
"""

from __future__ import annotations

from typing import Any, Optional

from nodehealth.checks.base import CheckSettings, Context, result, setting
from nodehealth.model import Action, CheckResult, Finding, Status, fold
from nodehealth.nccl import floors
from nodehealth.observations import NcclObservation, NcclRun, NvmlSnapshot, Observations, ProbeError
from nodehealth.observations.record import record

# The drain reason's code (``nh:<code>``, a published contract: never changes meaning) and what it says.
REASON = ("nccl", "the NCCL self-test below its bandwidth floor or on the wrong transport")

MODES = ("nvlink", "ib_loopback")
# nccl-tests' exit statuses (src/common.h testResult_t).
EXIT_USAGE = 6  # testInvalidUsage
EXIT_RESULTS = 7  # testNumResults: #wrong > 0, or the average bus bandwidth under NCCL_TESTS_MIN_BW x 0.9
EXIT_NAMES = {
    1: "internal error",
    2: "CUDA error",
    3: "NCCL error",
    4: "timeout (-T)",
    5: "not implemented",
    6: "invalid usage",
    7: "wrong results or bandwidth under NCCL_TESTS_MIN_BW",
}


@record
class Settings(CheckSettings):
    timeout_s: float = setting(
        120.0,
        "deadline of the whole self-test (every mode; each run gets an equal share of what is left); "
        "at it the runner's process group is killed",
        unit="s",
        min=1,
        max=600,
    )
    modes: tuple[str, ...] = setting(
        ("nvlink",),
        "modes to run: nvlink (NCCL picks every path) and ib_loopback (NCCL_P2P_DISABLE=1 "
        "NCCL_SHM_DISABLE=1: GPU to GPU through the node's NICs)",
        choices=MODES,
    )
    runner: str = setting(
        "auto",
        "nccl-tests (all_reduce_perf at all_reduce_perf), builtin (python -m nodehealth.nccl.builtin: "
        "nccl4py or torch), auto (nccl-tests when the binary is there, else builtin)",
        choices=("auto", "nccl-tests", "builtin"),
    )
    all_reduce_perf: str = setting(
        "/usr/local/bin/all_reduce_perf",
        "absolute path of nccl-tests' all_reduce_perf (running as root: "
        "root's own, in directories only root can write)",
    )
    args: tuple[str, ...] = setting(
        ("-b", "8M", "-e", "1G", "-f", "2", "-c", "1"),
        "arguments of the runner; -g <GPUs> is added unless "
        "they set it (the floors are measured at 8-16 GiB: -e 8G measures closer to them)",
    )
    json_output: str = setting(
        "auto",
        "nccl-tests' -J JSON output: auto (when the binary's usage lists it: nccl-tests 2.17.3 and later), on, off",
        choices=("auto", "on", "off"),
    )
    min_bw_gbps: float = setting(
        0.0,
        "exported as NCCL_TESTS_MIN_BW: nccl-tests then exits 7 when the AVERAGE bus bandwidth over "
        "all sizes is under 90 % of it; 0 = not set",
        unit="GB/s",
        min=0,
        max=100000,
    )
    nccl_net_ib: bool = setting(
        False, "in ib_loopback mode set NCCL_NET=IB: NCCL's init fails instead of falling back to sockets"
    )
    env: tuple[str, ...] = setting(
        (),
        "more environment for the runner, NAME=value each (e.g. NCCL_IB_HCA=mlx5_0,mlx5_1 or "
        "NCCL_TOPO_FILE=/etc/nccl/topo.xml)",
    )
    builtin_backend: str = setting(
        "auto",
        "backend of the built-in runner: auto (nccl4py, then torch), nccl4py, torch",
        choices=("auto", "nccl4py", "torch"),
    )
    python: str = setting(
        "", 'absolute path of the Python that runs the built-in runner; "" = the one running nodehealth'
    )
    gpus: int = setting(0, "GPUs to run on; 0 = every NVIDIA GPU on the PCI bus", unit="GPUs", min=0, max=64)
    gpu_model: str = setting("", 'GPU model to look the floor up with; "" = the name NVML reports for GPU 0')
    require_ib: bool = setting(
        True,
        "ib_loopback mode must carry the traffic over InfiniBand/RoCE (NET/IB, IBext, SHARP): NET/Socket is a FAIL",
    )
    fail_fraction: float = setting(
        0.8, "FAIL when the largest size's bus bandwidth is under this share of the floor", min=0, max=1
    )
    warn_fraction: float = setting(0.9, "WARN when it is under this share of the floor", min=0, max=1)
    nvlink_floor_gbps: float = setting(
        0.0,
        "this node's nvlink floor; 0 = from the floor table (nodehealth/data/nccl_floors.toml)",
        unit="GB/s",
        min=0,
        max=100000,
    )
    ib_loopback_floor_gbps: float = setting(
        0.0, "this node's ib_loopback floor; 0 = from the floor table", unit="GB/s", min=0, max=100000
    )
    interval_s: float = setting(
        21600.0,
        "the daemon runs the self-test this often, only while the node is idle (no job in the "
        "ledger, no compute process on a GPU); 0 = the daemon never runs it",
        unit="s",
        min=0,
        max=30 * 86400,
    )
    jitter_s: float = setting(
        900.0,
        "a random delay up to this, added to each interval (nodes of a cluster do not all test at once)",
        unit="s",
        min=0,
        max=86400,
    )

    def validate(self) -> None:
        if self.warn_fraction < self.fail_fraction:
            raise ValueError(f"warn_fraction {self.warn_fraction} is under fail_fraction {self.fail_fraction}")
        for item in self.env:
            name, eq, _ = item.partition("=")
            if (
                not eq
                or not name
                or not (name[0].isalpha() or name[0] == "_")
                or not all(c.isalnum() or c == "_" for c in name)
            ):
                raise ValueError(f"env: {item!r} is not NAME=value")
        for key in ("all_reduce_perf", "python"):
            value = getattr(self, key)
            if value and not value.startswith("/"):
                raise ValueError(f"{key}: {value!r} is not an absolute path")
        if not self.modes:
            raise ValueError("modes: at least one mode")


# Linux signal numbers (signal(7)) a crashed runner dies of.
SIGNALS = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    5: "SIGTRAP",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}


def _signal_name(num: int) -> str:
    return SIGNALS.get(num, f"signal {num}")


def _largest_busbw(run: NcclRun) -> Optional[float]:
    row = run.perf.largest if run.perf is not None else None
    if row is None:
        return None
    return row.oop_busbw_gbps if row.oop_busbw_gbps is not None else row.ip_busbw_gbps


def _model(obs: Observations, settings: Settings) -> Optional[str]:
    if settings.gpu_model:
        return settings.gpu_model
    snap = obs.nvml
    if isinstance(snap, NvmlSnapshot):
        for gpu in snap.gpus:
            if gpu.name:
                return gpu.name
    return None


def _floor(settings: Settings, mode: str, model: Optional[str], gpus: Optional[int]) -> tuple[Optional[float], str]:
    own = getattr(settings, f"{mode}_floor_gbps")
    if own:
        return float(own), f"[checks.nccl_selftest] {mode}_floor_gbps"
    found = floors.lookup(model, gpus, mode)
    if found is None:
        return None, f"no floor for {model or 'an unknown GPU model'} x{gpus} in {mode} mode"
    return found.floor_gbps, found.source


def judge_run(run: NcclRun, settings: Settings, model: Optional[str]) -> tuple[list[Finding], dict[str, Any]]:
    """The findings of one run, and what the metrics and the report show of it."""
    m = run.mode
    who = "all_reduce_perf" if run.runner == "nccl-tests" else "the built-in runner"
    d: dict[str, Any] = {
        "runner": run.runner,
        "gpus": run.gpus,
        "elapsed_s": round(run.elapsed_s, 3),
        "finished_at": run.finished_at,
        "returncode": run.returncode,
        "timed_out": run.timed_out,
    }
    tr = run.transport
    if tr is not None:
        d.update(transport=tr.transport, network=tr.network, paths=list(tr.paths), nccl_errors=list(tr.errors[:5]))
    if run.perf is not None:
        d["wrong"] = run.perf.wrong
        d["avg_busbw_gbps"] = run.perf.avg_busbw_gbps
        if run.perf.largest is not None:
            d["size_bytes"] = run.perf.largest.size_bytes
    if run.setup_error:
        d["setup_error"] = run.setup_error
        status = Status.SKIPPED if run.setup_kind == "missing" else Status.UNKNOWN
        return [Finding(status, f"{m}: {run.setup_error}")], d
    first_error = f": {tr.errors[0][:200]}" if tr is not None and tr.errors else ""
    if run.timed_out:
        d["outcome"] = "hung"
        return [
            Finding(
                Status.FAIL,
                f"{m}: {who} hung: killed with its process group at the {run.timeout_s:.1f} s "
                f"deadline ({run.output_bytes} bytes of output){first_error}",
                Action.REBOOT,
            )
        ], d
    if run.truncated:
        d["outcome"] = "output_cap"
        return [
            Finding(
                Status.UNKNOWN,
                f"{m}: {who} printed more than the output cap ({run.output_bytes} bytes "
                f"read): killed with its process group, no result to judge{first_error}",
            )
        ], d
    rc = run.returncode if run.returncode is not None else 0
    if rc < 0 or rc > 128:
        sig = -rc if rc < 0 else rc - 128
        d["outcome"] = "crashed"
        return [
            Finding(Status.FAIL, f"{m}: {who} crashed ({_signal_name(sig)}, exit {rc}){first_error}", Action.REBOOT)
        ], d
    wrong = run.perf.wrong if run.perf is not None else 0
    fatal = tr is not None and tr.fatal
    nic = Action.INSPECT if m == "ib_loopback" else Action.REBOOT
    if wrong:
        d["outcome"] = "wrong_results"
        return [
            Finding(
                Status.FAIL,
                f"{m}: {wrong} wrong element(s) in the all-reduce results (#wrong): the "
                "GPUs or the links between them corrupt data",
                Action.INSPECT,
            )
        ], d
    if fatal:
        d["outcome"] = "nccl_error"
        return [Finding(Status.FAIL, f"{m}: NCCL failed{first_error}", nic)], d
    if rc == EXIT_USAGE:
        d["outcome"] = "usage"
        return [
            Finding(
                Status.UNKNOWN,
                f"{m}: {who} rejected its arguments (exit 6, invalid usage): check [checks.nccl_selftest] args",
            )
        ], d
    if rc == EXIT_RESULTS and run.runner == "nccl-tests":
        d["outcome"] = "min_bw"
        avg = run.perf.avg_busbw_gbps if run.perf is not None else None
        return [
            Finding(
                Status.FAIL,
                f"{m}: average bus bandwidth {avg} GB/s under 90 % of NCCL_TESTS_MIN_BW "
                f"{settings.min_bw_gbps:g} (exit 7)",
                Action.INSPECT,
            )
        ], d
    if rc != 0:
        d["outcome"] = "exit"
        return [Finding(Status.FAIL, f"{m}: {who} exited {rc} ({EXIT_NAMES.get(rc, 'error')}){first_error}", nic)], d
    if run.output_bytes == 0:
        d["outcome"] = "no_output"
        return [Finding(Status.FAIL, f"{m}: {who} printed nothing and exited 0: no result to judge", Action.INSPECT)], d
    if run.perf is None:
        d["outcome"] = "unparsed"
        return [Finding(Status.UNKNOWN, f"{m}: could not parse the output of {who}: {run.perf_error}")], d
    busbw = _largest_busbw(run)
    if busbw is None:
        d["outcome"] = "no_rows"
        return [Finding(Status.FAIL, f"{m}: {who} exited 0 without a result row", Action.INSPECT)], d
    d["outcome"] = "ran"
    d["busbw_gbps"] = busbw
    out: list[Finding] = []
    gpus = run.perf.ranks or run.gpus
    if gpus is not None and gpus < 2:
        d["floor_note"] = "one GPU: an all-reduce moves no data between GPUs"
    else:
        floor, source = _floor(settings, m, model, gpus)
        d["floor_gbps"], d["floor_source"] = floor, source
        if floor is not None:
            size = run.perf.largest.size_bytes if run.perf.largest else 0
            where = f"{busbw:g} GB/s bus bandwidth at {size / (1 << 20):g} MiB"
            if busbw < settings.fail_fraction * floor:
                out.append(
                    Finding(
                        Status.FAIL,
                        f"{m}: {where}, under {settings.fail_fraction:.0%} of the {floor:g} GB/s floor",
                        Action.INSPECT,
                    )
                )
            elif busbw < settings.warn_fraction * floor:
                out.append(
                    Finding(
                        Status.WARN,
                        f"{m}: {where}, under {settings.warn_fraction:.0%} of the {floor:g} GB/s floor",
                        Action.INSPECT,
                    )
                )
    kind = tr.transport if tr is not None else "unknown"
    if m == "ib_loopback" and settings.require_ib:
        if kind == "socket":
            out.append(
                Finding(
                    Status.FAIL,
                    f"{m}: NCCL carried the traffic over {_net(tr, 'NET/Socket')}, not "
                    "InfiniBand (are the IB devices there, NCCL_IB_HCA right?)",
                    Action.INSPECT,
                )
            )
        elif kind == "unknown":
            out.append(Finding(Status.WARN, f"{m}: the NCCL_DEBUG output does not show what carried the traffic"))
        elif kind == "p2p":
            out.append(
                Finding(
                    Status.WARN,
                    f"{m}: the traffic stayed inside the node (P2P/SHM) although both "
                    "were disabled: the NICs were not tested",
                )
            )
    elif m == "nvlink" and kind in ("socket", "ib"):
        out.append(
            Finding(
                Status.WARN,
                f"{m}: NCCL went through {_net(tr, 'the network')} between GPUs of one node: P2P is not usable",
                Action.INSPECT,
            )
        )
    if tr is not None and tr.errors:
        out.append(Finding(Status.WARN, f"{m}: NCCL warned{first_error}"))
    return out, d


def _net(tr: Any, default: str) -> str:
    paths = [p for p in (tr.paths if tr is not None else ()) if p.startswith("NET/")]
    return ", ".join(paths) if paths else default


def evaluate(obs: Observations, settings: Settings, ctx: Context) -> CheckResult:
    o = obs.nccl
    if isinstance(o, ProbeError):
        return result(ctx, Status.UNKNOWN, f"self-test not run: {o.message}")
    if not isinstance(o, NcclObservation) or not o.runs:
        return result(ctx, Status.UNKNOWN, "self-test not run")
    model = _model(obs, settings)
    findings: list[Finding] = []
    runs: dict[str, Any] = {}
    for run in o.runs:
        f, d = judge_run(run, settings, model)
        d["status"] = max((x.status for x in f), default=Status.OK).name
        runs[run.mode] = d
        findings.extend(f)
    details: dict[str, Any] = {"model": model, "runs": runs}
    if all(f.status == Status.SKIPPED for f in findings) and findings:
        return result(ctx, Status.SKIPPED, "; ".join(f.message for f in findings), **details)
    findings = [f for f in findings if f.status != Status.SKIPPED] or findings
    parts = []
    for mode, d in runs.items():
        if "busbw_gbps" in d:
            floor = f" (floor {d['floor_gbps']:g})" if d.get("floor_gbps") else ""
            parts.append(f"{mode} {d['busbw_gbps']:g} GB/s{floor} via {d.get('transport', 'unknown')}")
    ok = "all-reduce " + ", ".join(parts) if parts else "all-reduce ran"
    return fold(ctx.name, findings, ok, details)
