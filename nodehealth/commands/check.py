"""``nodehealth check``: run the checks now and print the verdict."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from nodehealth import SCHEMA_VERSION, render
from nodehealth.commands.common import UsageError, fail_usage, load_config, use_color
from nodehealth.commands.options import ExitCode, add_config, add_format, add_simulate
from nodehealth.faces.table import FACES as TABLE
from nodehealth.faces.table import NAMES as FACES
from nodehealth.model import Status
from nodehealth.observations import NvmlSnapshot
from nodehealth.registry import BY_NAME
from nodehealth.xid.text import printable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run the health checks and print the verdict",
        description="Run the health checks. Exit 0 healthy (warnings allowed), 1 a check "
        "failed, 2 usage or config error (also a GPU index the node does not have, an unknown "
        "check, phase or face: nothing is judged), 3 internal error. With --as: the exit code the "
        "face would exit with (0 the job would start / the node is healthy, 1 the face would fail "
        "and drain), though nothing was acted on.",
    )
    add_config(p)
    add_simulate(p)
    p.add_argument(
        "--only",
        metavar="NAME",
        nargs="+",
        action="append",
        default=[],
        help="run only these checks (space or comma separated, may repeat)",
    )
    p.add_argument(
        "--phase",
        choices=(*(f.phase for f in TABLE), "manual"),
        default="manual",
        help="which phase's checks and budget to use (default: manual)",
    )
    p.add_argument(
        "--as",
        dest="as_face",
        choices=FACES,
        help="decide exactly as that face would, with its inputs (the daemon's verdict for the "
        "prolog, the cached Slurm view, the job's GPUs), and say what it would do; acts on "
        "nothing; exits with the face's would-be exit code (with --simulate: the face's checks "
        "run now on the simulated GPUs)",
    )
    p.add_argument("--job", metavar="ID", help="with --as: the job (SLURM_JOB_ID)")
    p.add_argument("--gpus", metavar="LIST", help="with --as: the job's GPUs (SLURM_JOB_GPUS, e.g. 0,1)")
    p.add_argument("-i", "--gpu", metavar="LIST", help="judge only these GPUs (NVML indexes, e.g. 0,3)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("-q", "--quiet", action="store_true", help="text: only what is not OK, and the verdict")
    out.add_argument("-v", "--verbose", action="store_true", help="text: each result's details too")
    add_format(p)
    p.set_defaults(func=run)


def gpu_list(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        out = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"-i/--gpu: '{printable(text)}' is not a list of GPU indexes like 0,3") from None
    if not out or min(out) < 0:
        raise UsageError(f"-i/--gpu: '{printable(text)}' is not a list of GPU indexes like 0,3")
    return out


def gpus_exist(gpus: Optional[tuple[int, ...]], nvml: object) -> None:
    """``-i`` naming a GPU NVML does not list is a usage error naming the GPUs there are (a typo must not
    pass as "no GPU, OK"). Checked once NVML answered with its count; when it did not, the ``nvml`` check
    (and each per-GPU check) says so in the report, which is never OK."""
    if gpus is None or not isinstance(nvml, NvmlSnapshot) or nvml.device_count is None:
        return
    count = nvml.device_count
    missing = [i for i in gpus if i >= count]
    if missing:
        there = "no GPU" if count == 0 else f"{count} GPU(s): " + (f"0-{count - 1}" if count > 1 else "0")
        raise UsageError(
            f"-i/--gpu: no GPU {','.join(map(str, missing))} on this node (NVML lists {there}; nothing was judged)"
        )


def check_names(groups: list[list[str]]) -> tuple[str, ...]:
    """--only a b --only c,d -> (a, b, c, d); UsageError naming unknown ones, with a suggestion.

    A name is echoed through ``printable`` (a terminal escape in it is shown, never acted on)."""
    names = [n for group in groups for item in group for n in item.split(",") if n]
    bad = []
    for name in names:
        if name not in BY_NAME:
            import difflib  # only for a name to correct

            near = difflib.get_close_matches(name, list(BY_NAME), n=1)
            bad.append(printable(name) + (f" (did you mean {near[0]}?)" if near else ""))
    if bad:
        raise UsageError(f"--only: unknown check(s) {', '.join(bad)} (see: nodehealth list-checks)")
    return tuple(dict.fromkeys(names))


def run(args: argparse.Namespace) -> int:

    try:
        only = check_names(args.only)
        if args.as_face:
            return _as_face(args)
        if args.job or args.gpus:
            raise UsageError(f"--job and --gpus go with --as {'|'.join(FACES)}")
        gpus = gpu_list(args.gpu)
        cfg = load_config(args)
        # By hand: the state dir is read (verdicts, ledger, XID store) and never written (read_only).
        judged = _execute(cfg, args.phase, only, gpus)
        gpus_exist(gpus, judged.observations.nvml)
    except UsageError as exc:
        return fail_usage(exc)
    report = judged.report
    if args.format == "json":
        sys.stdout.write(render.as_json(report))
    else:
        if not args.quiet:
            sys.stdout.write(f"config: {config_file(args)}\n")
        sys.stdout.write(render.text(report, color=use_color(sys.stdout), quiet=args.quiet, verbose=args.verbose))
    return exit_code(report.status, cfg.policy.unknown)


def _execute(cfg: Any, phase: str, only: tuple[str, ...], gpus: Optional[tuple[int, ...]]) -> Any:
    """The run, with a progress line on a terminal's stderr while it takes over a second
    (``commands.progress``: what it waits for, the budget)."""
    from nodehealth import runner
    from nodehealth.commands import progress
    from nodehealth.config.loader import phase_budget

    watch, budget = progress.Watch(), phase_budget(cfg, phase)
    with progress.Line(sys.stderr, lambda elapsed: progress.describe(watch, budget, elapsed)) as line:
        probes = progress.watched(watch) if line.active() else None
        return runner.execute(cfg, phase=phase, only=only, gpus=gpus, read_only=True, probes=probes)


def config_file(args: argparse.Namespace) -> str:
    from nodehealth.config.lean import config_path

    path, explicit = config_path(getattr(args, "config", None), os.environ)
    if not explicit and not os.path.exists(path):
        return f"{printable(path, None)} (absent: built-in defaults)"
    return printable(path, None)


def _as_face(args: argparse.Namespace) -> int:
    """``--as FACE``: the face's own decision (``nodehealth.faces.preview``), nothing acted on."""
    import json

    from nodehealth.faces.preview import preview
    from nodehealth.statedir.layout import MAX_JOB_ID, valid_job_id

    if args.only or args.phase != "manual" or args.gpu is not None:
        raise UsageError(
            "--as runs the face's own checks, phase and GPUs: no --only, --phase or -i/--gpu (the job's GPUs: --gpus)"
        )
    env = dict(os.environ)
    if args.config:
        env["NODEHEALTH_CONFIG"] = args.config
    if args.job:
        env["SLURM_JOB_ID"] = args.job
    if args.gpus:
        env["SLURM_JOB_GPUS"] = args.gpus
    if args.job is not None and valid_job_id(args.job) is None:
        raise UsageError(f"--job: '{printable(args.job)}' is not a Slurm job id (a plain number, 1 to {MAX_JOB_ID})")
    from nodehealth.commands import progress
    from nodehealth.config.use import ConfigError

    watch = progress.Watch()
    try:
        with progress.Line(sys.stderr, lambda elapsed: progress.describe(watch, None, elapsed)) as line:
            probes = progress.watched(watch) if line.active() else None
            result = preview(args.as_face, env, simulate=args.simulate, probes=probes)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.format == "json":
        doc = (
            json.loads(render.as_json(result.report))
            if result.report is not None
            else {"schema_version": SCHEMA_VERSION}
        )
        doc["as"] = {
            "face": result.face,
            "source": result.source,
            "inputs": result.inputs,
            "decision": result.decision,
            "recorded": result.recorded,
            "exit_code": result.exit_code,
            "config": config_file(args),
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:  # the config line first, as a plain check prints it
        sys.stdout.write(f"config: {config_file(args)}\n")
        if result.report is not None:
            sys.stdout.write(render.text(result.report, color=use_color(sys.stdout)))
        sys.stdout.write("\n".join(result.lines()) + "\n")
    return result.exit_code


def exit_code(status: Status, unknown_policy: str) -> int:
    if status == Status.FAIL or (status == Status.UNKNOWN and unknown_policy == "fail"):
        return ExitCode.FAULT
    return ExitCode.OK
